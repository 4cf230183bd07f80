package database_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
)

// sessionsOf counts the server's sessions of an application name.
func sessionsOf(t *testing.T, admin *pgx.Conn, app string) int {
	t.Helper()
	var n int
	require.NoError(t, admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n))
	return n
}

// TestServerBudget: workspaces whose databases live on one server share
// its budget of connections, as the server counts them: a connection past
// it closes another workspace's idle connection, or waits for one to be
// released (which is then handed over), or, when the caller's context ends
// first, fails with ErrServerBusy.
func TestServerBudget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const app = "server-budget-test"
	pools, err := database.New(database.Config{ApplicationName: app, MaxConns: 2, ServerMaxConns: 2})
	require.NoError(t, err)
	defer pools.Close()
	admin, err := pgx.Connect(ctx, pgtest.Shared(t).AdminURL())
	require.NoError(t, err)
	defer func() { _ = admin.Close(ctx) }()
	leases := map[string]*database.Lease{}
	for _, id := range []string{"a", "b", "c"} {
		url := pgtest.NewDatabase(t, nil)
		if id == "b" {
			// b's connections wait at most a second for a place.
			url += map[bool]string{true: "&", false: "?"}[strings.Contains(url, "?")] + "connect_timeout=1"
		}
		l, err := pools.Acquire(ctx, registry.Workspace{ID: id, Database: registry.Database{URL: url}})
		require.NoError(t, err)
		defer l.Release()
		leases[id] = l
	}
	use := func(ctx context.Context, id string) error {
		var one int
		return leases[id].Pool.QueryRow(ctx, "SELECT 1").Scan(&one)
	}

	// Two connections of a, held: the server's budget is spent.
	a1, err := leases["a"].Pool.Acquire(ctx)
	require.NoError(t, err)
	defer a1.Release()
	a2, err := leases["a"].Pool.Acquire(ctx)
	require.NoError(t, err)
	defer a2.Release()
	require.Equal(t, 2, sessionsOf(t, admin, app))

	// b's first connection waits; past its connect timeout it fails as
	// busy, a failure a caller may retry.
	err = use(ctx, "b")
	require.ErrorIs(t, err, database.ErrServerBusy)
	require.Zero(t, pools.ServerWaiting())

	// b waits again; a connection a releases is closed, not kept idle, and
	// its place handed over to b: with no recheck of idle connections
	// within b's wait, only the hand-over lets b in.
	pools.SetIdleRecheck(time.Hour)
	done := make(chan error, 1)
	go func() { done <- use(ctx, "b") }()
	require.Eventually(t, func() bool { return pools.ServerWaiting() == 1 }, 30*time.Second, time.Millisecond, "b waits for a place")
	a1.Release()
	require.NoError(t, <-done)
	require.LessOrEqual(t, sessionsOf(t, admin, app), 2)
	pools.SetIdleRecheck(100 * time.Millisecond)

	// a's other connection goes back idle; c takes its place by closing it.
	a2.Release()
	require.Eventually(t, func() bool { return leases["a"].Pool.Stat().IdleConns() == 1 }, 30*time.Second, time.Millisecond)
	require.NoError(t, use(ctx, "c"))
	require.Zero(t, leases["a"].Pool.Stat().TotalConns(), "a's idle connection was closed for c")
	require.LessOrEqual(t, sessionsOf(t, admin, app), 2)
	for key, n := range pools.ServerConns() {
		require.LessOrEqual(t, n, 2, key)
	}
}

// TestTryAcquireAll: all of the pools or none, without waiting.
func TestTryAcquireAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t, nil)
	pools, err := database.New(database.Config{MaxOpen: 3, IdleTimeout: -1})
	require.NoError(t, err)
	defer pools.Close()
	ws := func(ids ...string) []registry.Workspace {
		out := make([]registry.Workspace, len(ids))
		for i, id := range ids {
			out[i] = registry.Workspace{ID: id, Database: registry.Database{URL: url}}
		}
		return out
	}
	held := pools.TryAcquireAll(ctx, ws("a", "b"))
	require.Len(t, held, 2)
	require.Nil(t, pools.TryAcquireAll(ctx, ws("c", "d")), "two more pools do not fit in three")
	require.Equal(t, 2, pools.Open(), "none taken")
	more := pools.TryAcquireAll(ctx, ws("b", "c"))
	require.Len(t, more, 2, "b is open already, c fits")
	for _, l := range append(held, more...) {
		l.Release()
	}
	require.Zero(t, pools.Open())
}

// TestServerBudgetIsPerServerNotPerSpelling: two workspaces whose URLs
// name one server differently (127.0.0.1 and localhost) share its budget.
func TestServerBudgetIsPerServerNotPerSpelling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pools, err := database.New(database.Config{ApplicationName: "server-spelling-test", MaxConns: 2, ServerMaxConns: 2})
	require.NoError(t, err)
	defer pools.Close()
	byAddress := pgtest.NewDatabase(t, nil)
	require.Contains(t, byAddress, "@127.0.0.1:")
	byName := strings.Replace(pgtest.NewDatabase(t, nil), "@127.0.0.1:", "@localhost:", 1)
	byName += map[bool]string{true: "&", false: "?"}[strings.Contains(byName, "?")] + "connect_timeout=1"
	a, err := pools.Acquire(ctx, registry.Workspace{ID: "a", Database: registry.Database{URL: byAddress}})
	require.NoError(t, err)
	defer a.Release()
	b, err := pools.Acquire(ctx, registry.Workspace{ID: "b", Database: registry.Database{URL: byName}})
	require.NoError(t, err)
	defer b.Release()
	require.Len(t, pools.ServerConns(), 1, "one server, whatever its spelling")

	a1, err := a.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer a1.Release()
	a2, err := a.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer a2.Release()
	var one int
	require.ErrorIs(t, b.Pool.QueryRow(ctx, "SELECT 1").Scan(&one), database.ErrServerBusy, "the budget is spent by the other spelling")
}

// forward serves a loopback port that forwards every connection to addr:
// to the product, another server (its budget is per host and port).
func forward(t *testing.T, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				s, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				defer s.Close()
				go func() { _, _ = io.Copy(s, c); s.Close() }()
				_, _ = io.Copy(c, s)
			}()
		}
	}()
	return ln.Addr().String()
}

// TestServerBudgetTakesNothingFromAnotherServer: a server whose budget is
// spent never closes another server's idle connection to make room (that
// would free nothing on the full server): the caller waits for its own
// server's place, and the other server's connection stays.
func TestServerBudgetTakesNothingFromAnotherServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pools, err := database.New(database.Config{ApplicationName: "server-other-test", MaxConns: 1, ServerMaxConns: 1})
	require.NoError(t, err)
	defer pools.Close()
	first := pgtest.NewDatabase(t, nil)
	first += map[bool]string{true: "&", false: "?"}[strings.Contains(first, "?")] + "connect_timeout=1"
	u, err := url.Parse(pgtest.NewDatabase(t, nil))
	require.NoError(t, err)
	u.Host = forward(t, u.Host)
	acquire := func(id, dbURL string) *database.Lease {
		l, err := pools.Acquire(ctx, registry.Workspace{ID: id, Database: registry.Database{URL: dbURL}})
		require.NoError(t, err)
		t.Cleanup(l.Release)
		return l
	}
	a, b, other := acquire("a", first), acquire("b", first), acquire("other", u.String())
	require.Len(t, pools.ServerConns(), 2, "two servers")

	var one int
	require.NoError(t, other.Pool.QueryRow(ctx, "SELECT 1").Scan(&one))
	require.Eventually(t, func() bool { return other.Pool.Stat().IdleConns() == 1 }, 30*time.Second, time.Millisecond,
		"the other server's connection, idle")
	held, err := a.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer held.Release()

	require.ErrorIs(t, b.Pool.QueryRow(ctx, "SELECT 1").Scan(&one), database.ErrServerBusy, "b waits for its own server's place")
	require.Equal(t, int32(1), other.Pool.Stat().IdleConns(), "the other server's idle connection was left alone")
}

// TestTryAcquireAllKeysServersByAddress: the verifier's shared-table round
// opens its pools with TryAcquireAll, which resolves the hosts first as
// Acquire does: two workspaces naming one server differently (localhost and
// 127.0.0.1) share one budget there too.
func TestTryAcquireAllKeysServersByAddress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pools, err := database.New(database.Config{ApplicationName: "try-acquire-spelling-test", MaxOpen: 4})
	require.NoError(t, err)
	defer pools.Close()
	byAddress := pgtest.NewDatabase(t, nil)
	byName := strings.Replace(pgtest.NewDatabase(t, nil), "@127.0.0.1:", "@localhost:", 1)
	held := pools.TryAcquireAll(ctx, []registry.Workspace{{ID: "a", Database: registry.Database{URL: byAddress}},
		{ID: "b", Database: registry.Database{URL: byName}}})
	require.Len(t, held, 2)
	for _, l := range held {
		var one int
		require.NoError(t, l.Pool.QueryRow(ctx, "SELECT 1").Scan(&one))
		l.Release()
	}
	require.Len(t, pools.ServerConns(), 1, "one server, whatever its spelling")
}

// TestLoopbackSpellingsShareABudget: 127.0.0.1, localhost and [::1] are one
// server (this machine's), whatever the port's listener, so their keys are
// one; database.server names a server for any spelling.
func TestLoopbackSpellingsShareABudget(t *testing.T) {
	t.Parallel()
	require.Equal(t, database.ServerKeyOf("127.0.0.1", 5432, ""), database.ServerKeyOf("::1", 5432, ""))
	require.Equal(t, database.ServerKeyOf("127.0.0.2", 5432, ""), database.ServerKeyOf("[::1]", 5432, ""))
	require.NotEqual(t, database.ServerKeyOf("127.0.0.1", 5432, ""), database.ServerKeyOf("127.0.0.1", 5433, ""), "another port, another server")
	require.Equal(t, database.ServerKeyOf("10.0.0.7", 5432, "primary"), database.ServerKeyOf("fd00::7", 5432, "primary"), "named alike: one server")
	require.NotEqual(t, database.ServerKeyOf("10.0.0.7", 5432, ""), database.ServerKeyOf("fd00::7", 5432, ""), "nothing ties them: two")
}
