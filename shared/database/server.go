package database

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/segmentstream/ontology-replication/shared/registry"
)

// The per-server budget.
//
// PostgreSQL's max_connections is per server, and one Cloud SQL instance
// holds many workspace databases, so a pool per workspace database bounds
// nothing the server counts. Every pool's dial goes through its server's
// budget instead: a connection takes one of Config.ServerMaxConns places
// before it dials and gives it back when it closes (its net.Conn's Close,
// which pgconn calls however the connection ends). A dial that finds every
// place taken closes one idle connection of another workspace's pool on the
// same server (idle: in that pool, not held by any caller, so nothing is
// lost) and takes its place; with none idle it waits for a connection to
// close, and while a dial waits, a connection released by its caller is
// closed instead of kept idle, handing its place over. The wait is the dial's: pgconn bounds it with the connect timeout
// (10 s unless the URL sets connect_timeout), and it ends with ErrServerBusy,
// a failure a caller may retry (an HTTP caller answers 503).

// ErrServerBusy: every connection this process may open to the workspace's
// PostgreSQL server is in use.
var ErrServerBusy = errors.New("database: every connection this process may open to the server is in use")

// serverKey names the PostgreSQL server a workspace's database lives on,
// whose budget its connections take: the registry's database.server when
// set; else its Cloud SQL instance; else, for a host, "loopback" and the
// port when the host is a loopback address or resolves to one (127.0.0.1,
// localhost and [::1] are this machine, and one server listens on them),
// or the least of the addresses it resolves to (as resolveHosts cached
// them) and the port, so that two spellings of one server (a name and its
// address) share one budget. A Unix socket is keyed by its directory. A
// server reached by addresses nothing ties together (an IPv4 address in one
// URL, an IPv6 address in another) needs database.server.
func (p *Pools) serverKey(db registry.Database, cfg *pgxpool.Config) string {
	switch {
	case db.Server != "":
		return "server:" + db.Server
	case db.Instance != "":
		return "cloudsql:" + db.Instance
	}
	host, port := cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))
	if strings.HasPrefix(host, "/") {
		return "unix:" + net.JoinHostPort(host, port)
	}
	return net.JoinHostPort(p.hosts.address(host), port)
}

// hostCache keeps the address each database host resolved to, for a
// minute: pools are opened under the Pools' lock, which no lookup may be
// made under, so Acquire resolves first (resolveHosts).
type hostCache struct {
	mu sync.Mutex
	m  map[string]resolvedHost
}

type resolvedHost struct {
	addr  string
	until time.Time
}

// resolveTimeout bounds one host lookup; a host that does not resolve in
// time is keyed by its name.
const resolveTimeout = 2 * time.Second

// resolveHosts looks up the hosts of the workspaces' URL databases that
// are not cached, outside any lock.
func (p *Pools) resolveHosts(ctx context.Context, wss ...registry.Workspace) {
	for _, ws := range wss {
		if ws.Database.URL == "" {
			continue
		}
		cfg, err := pgconn.ParseConfig(ws.Database.URL)
		if err != nil || strings.HasPrefix(cfg.Host, "/") {
			continue
		}
		p.hosts.resolve(ctx, cfg.Host)
	}
}

// resolve looks a host up, unless cached, and caches the least of its
// addresses (the host itself when it is an address or does not resolve).
func (h *hostCache) resolve(ctx context.Context, host string) {
	h.mu.Lock()
	r, ok := h.m[host]
	h.mu.Unlock()
	if ok && time.Now().Before(r.until) {
		return
	}
	addr := canonicalAddress(host)
	if net.ParseIP(host) == nil {
		ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
		defer cancel()
		if addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host); err == nil && len(addrs) > 0 {
			ips := make([]string, len(addrs))
			for i, a := range addrs {
				ips[i] = canonicalAddress(a.IP.String())
			}
			addr = slices.Min(ips)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[string]resolvedHost{}
	}
	h.m[host] = resolvedHost{addr: addr, until: time.Now().Add(time.Minute)}
}

// address is the cached address of host (host itself when not cached).
func (h *hostCache) address(host string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r, ok := h.m[host]; ok {
		return r.addr
	}
	return canonicalAddress(host)
}

// loopbackServer is the address key of every loopback address: one server
// of this machine listens on 127.0.0.1 and ::1 alike (PostgreSQL's
// listen_addresses = 'localhost').
const loopbackServer = "loopback"

// canonicalAddress is an address as a server key takes it: its canonical
// text, or loopbackServer for any loopback address (and a name as it is).
func canonicalAddress(host string) string {
	ip := net.ParseIP(strings.Trim(host, "[]"))
	switch {
	case ip == nil:
		return host
	case ip.IsLoopback():
		return loopbackServer
	}
	return ip.String()
}

func (p *Pools) serverLocked(key string) *server {
	srv := p.servers[key]
	if srv == nil {
		srv = &server{key: key, closed: make(chan struct{})}
		p.servers[key] = srv
	}
	return srv
}

// budget makes every connection of cfg's pool go through srv's budget.
// A pooled database's connection is closed when it is released: in session
// mode an idle client keeps its server connection from the pooler's other
// clients (another instance's drainer of the same workspace would wait in
// the pooler's queue for it), so the pooler, not the process, keeps it
// warm.
func (p *Pools) budget(cfg *pgxpool.Config, srv *server, pooled bool) {
	cfg.AfterRelease = func(*pgx.Conn) bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return srv.waiting == 0 && !pooled // false: closed, its place handed over
	}
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if err := p.take(ctx, srv); err != nil {
			return nil, err
		}
		conn, err := dial(ctx, network, addr)
		if err != nil {
			p.giveBack(srv)
			return nil, err
		}
		p.mu.Lock()
		srv.opened++
		p.mu.Unlock()
		return &budgetedConn{Conn: conn, giveBack: sync.OnceFunc(func() { p.giveBack(srv) })}, nil
	}
}

// take takes one of srv's places: a free one, one freed by closing an idle
// connection of another pool on srv, or the first one freed before ctx ends.
func (p *Pools) take(ctx context.Context, srv *server) error {
	// Give up a moment before the dial's deadline, so that the caller's
	// error names the budget (pgconn reports a dial that outlived its
	// context only as a timeout).
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-min(time.Until(deadline)/10, 100*time.Millisecond)))
		defer cancel()
	}
	for {
		p.mu.Lock()
		if srv.open < p.cfg.ServerMaxConns {
			srv.open++
			p.mu.Unlock()
			return nil
		}
		closed := srv.closed
		siblings := p.idleOnLocked(srv)
		srv.waiting++
		recheckAfter := p.idleRecheck
		p.mu.Unlock()
		var err error
		if !closeOneIdle(ctx, siblings) {
			// Wait for a place, and look again for idle connections now
			// and then: a connection becomes idle without closing (a pool
			// takes a released one back asynchronously, and keeps one
			// dialled for a caller that has since given up), and a dial
			// waiting only for a close would sit its whole connect timeout
			// beside it.
			recheck := time.NewTimer(recheckAfter)
			select {
			case <-closed:
			case <-recheck.C:
			case <-ctx.Done():
				err = fmt.Errorf("%w (%s, %d connections): %w", ErrServerBusy, srv.key, p.cfg.ServerMaxConns, ctx.Err())
			}
			recheck.Stop()
		}
		p.mu.Lock()
		srv.waiting--
		p.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// defaultIdleRecheck is how often a dial waiting for a place looks again
// for an idle connection to close: a tenth of a second, short beside a
// connect timeout of seconds and long beside the lock it takes.
const defaultIdleRecheck = 100 * time.Millisecond

func (p *Pools) giveBack(srv *server) {
	p.mu.Lock()
	srv.open--
	close(srv.closed)
	srv.closed = make(chan struct{})
	p.mu.Unlock()
}

// idleOnLocked returns the open pools on srv that hold idle connections,
// least recently used first.
func (p *Pools) idleOnLocked(srv *server) []*pgxpool.Pool {
	var found []*entry
	for _, e := range p.pools {
		if e.server == srv && !e.closing && e.pool.Stat().IdleConns() > 0 {
			found = append(found, e)
		}
	}
	slices.SortFunc(found, func(a, b *entry) int { return a.lastUsed.Compare(b.lastUsed) })
	pools := make([]*pgxpool.Pool, len(found))
	for i, e := range found {
		pools[i] = e.pool
	}
	return pools
}

// closeOneIdle closes one idle connection of the first pool that has one:
// it takes the pool's idle connections, closes one (its place goes back to
// the server's budget) and hands the others back.
func closeOneIdle(ctx context.Context, pools []*pgxpool.Pool) bool {
	for _, pool := range pools {
		idle := pool.AcquireAllIdle(ctx)
		if len(idle) == 0 {
			continue
		}
		_ = idle[0].Conn().Close(ctx)
		for _, c := range idle {
			c.Release() // the closed one is destroyed
		}
		return true
	}
	return false
}

// budgetedConn gives its place back to the server's budget when closed.
type budgetedConn struct {
	net.Conn
	giveBack func()
}

func (c *budgetedConn) Close() error {
	defer c.giveBack()
	return c.Conn.Close()
}
