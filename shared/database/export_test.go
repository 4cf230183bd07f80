package database

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/segmentstream/ontology-replication/shared/registry"
)

// What only the tests read of the pools' per-server budget.

// ServerConns reports how many connections this process has open to each
// PostgreSQL server, by server key (Cloud SQL instance or host:port).
func (p *Pools) ServerConns() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.servers))
	for key, srv := range p.servers {
		out[key] = srv.open
	}
	return out
}

// ServerWaiting reports how many connections are waiting for a place in
// their server's budget.
func (p *Pools) ServerWaiting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, srv := range p.servers {
		n += srv.waiting
	}
	return n
}

// ServerKeyOf is the server key of a database at host and port, named
// server in the registry ("" for none), without resolving a name.
func ServerKeyOf(host string, port uint16, server string) string {
	p := &Pools{}
	cfg, err := pgxpool.ParseConfig(fmt.Sprintf("postgres://u@%s/db", net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(int(port)))))
	if err != nil {
		panic(err)
	}
	return p.serverKey(registry.Database{Server: server}, cfg)
}

// Open reports how many workspace pools are open.
func (p *Pools) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pools)
}

// SetIdleRecheck sets how often a dial waiting for a place looks for an
// idle connection to close: a test that waits for the hand-over of a
// released connection sets it beyond the wait, so that only the hand-over
// can end it.
func (p *Pools) SetIdleRecheck(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.idleRecheck = d
}
