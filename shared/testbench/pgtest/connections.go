package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// SessionsOpened returns a function that reports how many sessions the
// server has opened on the database of databaseURL since SessionsOpened
// was called, as PostgreSQL counts them (pg_stat_database.sessions), read
// over a connection to the postgres database so that the reading adds
// none. A new session's count reaches the statistics when its first
// statement completes (a backend that has never flushed its statistics
// flushes them at once), so a command's sessions are all counted once it
// has returned, provided nothing else uses the database meanwhile.
func SessionsOpened(ctx context.Context, tb testing.TB, databaseURL string) func() int64 {
	tb.Helper()
	u, err := url.Parse(databaseURL)
	if err != nil {
		tb.Fatalf("pgtest: parse the database URL: %v", err)
	}
	database := strings.TrimPrefix(u.Path, "/")
	u.Path = "/postgres"
	monitor, err := pgx.Connect(ctx, u.String())
	if err != nil {
		tb.Fatalf("pgtest: connect to count sessions: %v", err)
	}
	tb.Cleanup(func() { _ = monitor.Close(context.Background()) })
	read := func() int64 {
		var n int64
		if err := monitor.QueryRow(ctx, `SELECT sessions FROM pg_stat_database WHERE datname = $1`, database).Scan(&n); err != nil {
			tb.Fatalf("pgtest: read the sessions of %s: %v", database, err)
		}
		return n
	}
	before := read()
	return func() int64 { return read() - before }
}

// ClientConnections counts this process's TCP connections to the cluster:
// its sockets (/proc/self/fd) that /proc/net/tcp lists as established to the
// cluster's port. It returns -1 where /proc is not there.
func (c *Cluster) ClientConnections() int {
	port := c.admin.Port()
	n, err := strconv.Atoi(port)
	if err != nil {
		return -1
	}
	raw, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return -1
	}
	hexPort := fmt.Sprintf("%04X", n)
	toServer := map[string]bool{} // socket inodes
	for _, line := range strings.Split(string(raw), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 || f[3] != "01" { // 01: ESTABLISHED
			continue
		}
		if remote := strings.Split(f[2], ":"); len(remote) == 2 && remote[1] == hexPort {
			toServer[f[9]] = true
		}
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	count := 0
	for _, fd := range fds {
		link, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if err == nil && strings.HasPrefix(link, "socket:[") && toServer[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
			count++
		}
	}
	return count
}

// WatchClientConnections samples ClientConnections every millisecond until
// stop is called, and returns the most it saw. The server's
// max_connections is the hard bound; this is the figure to report.
func (c *Cluster) WatchClientConnections(t testing.TB) (stop func() int64) {
	t.Helper()
	if c.ClientConnections() < 0 {
		t.Fatal("pgtest: counting connections needs /proc")
	}
	var peak atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			if n := int64(c.ClientConnections()); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	return func() int64 {
		close(done)
		wg.Wait()
		return peak.Load()
	}
}

// TerminateBackends ends, as an operator's pg_terminate_backend or a
// failover would, every session of the current database whose
// application_name is name, and returns how many it ended. db must be a
// superuser's (or the sessions' role's) connection.
func TerminateBackends(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, name string) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1 AND pid <> pg_backend_pid()`, name).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("pgtest: terminate the sessions of %s: %w", name, err)
	}
	return n, nil
}
