package database_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/cloudsqlconn"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"golang.org/x/oauth2"

	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestPoolPerWorkspace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t, nil)
	pools, err := database.New(database.Config{})
	require.NoError(t, err)
	defer pools.Close()
	ws := registry.Workspace{ID: "w1", Database: registry.Database{URL: url, MaxConns: 3}}
	a, err := pools.Acquire(ctx, ws)
	require.NoError(t, err)
	b, err := pools.Acquire(ctx, ws)
	require.NoError(t, err)
	require.Same(t, a.Pool, b.Pool, "one pool per workspace, shared while in use")
	require.EqualValues(t, 3, a.Pool.Config().MaxConns, "the registry's max_conns")
	var app string
	require.NoError(t, a.Pool.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&app))
	require.Equal(t, "ontology-replication", app)
	other, err := pools.Acquire(ctx, registry.Workspace{ID: "w2", Database: registry.Database{URL: url}})
	require.NoError(t, err)
	require.NotSame(t, a.Pool, other.Pool)
	require.EqualValues(t, 2, other.Pool.Config().MaxConns, "the default pool size")
	a.Release()
	a.Release() // idempotent
	b.Release()
	other.Release()

	_, err = pools.Acquire(ctx, registry.Workspace{ID: "bad", Database: registry.Database{URL: "postgres://u:secret@[::1"}})
	require.ErrorContains(t, err, "workspace bad")
	require.NotContains(t, err.Error(), "secret")
	_, err = database.New(database.Config{MaxConns: 40})
	require.ErrorContains(t, err, "MaxConns 40")
}

// TestPoolsAreBoundedAndClosed: with MaxOpen pools open, the next
// workspace's Acquire closes the least recently used idle pool, or waits
// until one is released; a pool idle for IdleTimeout is closed, and with a
// negative IdleTimeout as soon as its lease ends. The connections counted
// by the pools' hooks never pass the bound.
func TestPoolsAreBoundedAndClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t, nil)
	var open, peak atomic.Int64
	connected := func() {
		n := open.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
	}
	pools, err := database.New(database.Config{MaxConns: 1, MaxOpen: 2, IdleTimeout: -1,
		OnConnect: connected, OnClose: func() { open.Add(-1) }})
	require.NoError(t, err)
	defer pools.Close()
	ws := func(id string) registry.Workspace {
		return registry.Workspace{ID: id, Database: registry.Database{URL: url}}
	}
	use := func(l *database.Lease) {
		var one int
		require.NoError(t, l.Pool.QueryRow(ctx, "SELECT 1").Scan(&one))
	}
	a, err := pools.Acquire(ctx, ws("a"))
	require.NoError(t, err)
	use(a)
	b, err := pools.Acquire(ctx, ws("b"))
	require.NoError(t, err)
	use(b)
	require.Equal(t, 2, pools.Open())

	// A third waits: both pools are held.
	waited := make(chan *database.Lease)
	go func() {
		c, err := pools.Acquire(ctx, ws("c"))
		if err != nil {
			close(waited)
			return
		}
		waited <- c
	}()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = pools.Acquire(short, ws("d"))
	require.ErrorContains(t, err, "waiting for one of 2 open pools")
	a.Release() // closed at once (IdleTimeout < 0), making room for c
	c := <-waited
	require.NotNil(t, c)
	use(c)
	require.Equal(t, 2, pools.Open())
	b.Release()
	c.Release()
	require.Zero(t, pools.Open(), "closed when released")
	require.Zero(t, open.Load(), "their connections closed")
	require.LessOrEqual(t, peak.Load(), int64(2), "never more than MaxOpen × MaxConns connections")

	// Idle timeout: a pool nobody holds is closed after it.
	idle, err := database.New(database.Config{IdleTimeout: time.Second})
	require.NoError(t, err)
	defer idle.Close()
	l, err := idle.Acquire(ctx, ws("a"))
	require.NoError(t, err)
	use(l)
	l.Release()
	require.Equal(t, 1, idle.Open())
	require.Eventually(t, func() bool { return idle.Open() == 0 }, 10*time.Second, 10*time.Millisecond)
}

// TestSessionTimeoutsBoundWhatTransactionsCannot: every connection of a
// pool carries statement_timeout 30s and lock_timeout 5s for its session,
// so that even a statement's first preparation (pgx prepares a pipeline's
// statements before the SET LOCAL that leads it runs) gives up on a locked
// table with lock_not_available instead of waiting for its caller.
func TestSessionTimeoutsBoundWhatTransactionsCannot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t, nil)
	pools, err := database.New(database.Config{})
	require.NoError(t, err)
	defer pools.Close()
	lease, err := pools.Acquire(ctx, registry.Workspace{ID: "w1", Database: registry.Database{URL: url}})
	require.NoError(t, err)
	defer lease.Release()
	var statement, lock string
	require.NoError(t, lease.Pool.QueryRow(ctx, "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')").Scan(&statement, &lock))
	require.Equal(t, []string{"30s", "5s"}, []string{statement, lock})

	_, err = lease.Pool.Exec(ctx, "CREATE TABLE locked (n int)")
	require.NoError(t, err)
	holder, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer holder.Close(ctx)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "LOCK TABLE locked IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	deadline, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	batch := &pgx.Batch{}
	batch.Queue("SELECT set_config('lock_timeout', '1h', true)")
	batch.Queue("SELECT count(*) FROM locked WHERE n > $1", 0)
	err = lease.Pool.SendBatch(deadline, batch).Close()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the preparation waited for the caller's deadline")
	require.Equal(t, "55P03", pgErr.Code)
}

// TestCloudSQLSettings: a Cloud SQL workspace's pool logs in as its IAM
// user to its database, names taken as they are (no quoting to get
// wrong), with no TLS of pgx's own (the connector's tunnel is TLS).
func TestCloudSQLSettings(t *testing.T) {
	t.Parallel()
	static := oauth2.StaticTokenSource(&oauth2.Token{AccessToken: "test", Expiry: time.Now().Add(time.Hour)})
	pools, err := database.New(database.Config{DialerOptions: []cloudsqlconn.Option{cloudsqlconn.WithIAMAuthNTokenSources(static, static)}})
	require.NoError(t, err)
	defer pools.Close()
	for _, name := range []string{"ontology", `it's a "name" \ with spaces`} {
		l, err := pools.Acquire(context.Background(), registry.Workspace{ID: name, Database: registry.Database{
			Instance: "acme:europe-west1:ontology", Name: name, User: "replication-drain@acme.iam", IAMAuth: true}})
		require.NoError(t, err)
		cfg := l.Pool.Config().ConnConfig
		require.Equal(t, "replication-drain@acme.iam", cfg.User)
		require.Equal(t, name, cfg.Database)
		require.Nil(t, cfg.TLSConfig)
		require.Empty(t, cfg.Password)
		require.NotNil(t, cfg.DialFunc)
		l.Release()
	}
}
