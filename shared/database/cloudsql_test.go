package database_test

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/testbench/cloudsqlproxy"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
)

// cloudSQLWorkspace is a workspace whose database is on the stand-in
// instance, logged in to as user.
func cloudSQLWorkspace(id, name, user string, privateIP bool) registry.Workspace {
	return registry.Workspace{ID: id, Database: registry.Database{Instance: "acme:europe-west1:ontology", Name: name, User: user,
		IAMAuth: true, PrivateIP: privateIP}}
}

// databaseName is a database URL's name.
func databaseName(t *testing.T, url string) string {
	cfg, err := pgconn.ParseConfig(url)
	require.NoError(t, err)
	return cfg.Database
}

// TestCloudSQLDialledThroughTheConnector: a Cloud SQL workspace's pool
// reaches its database through the real connector: the Admin API's
// connect settings and an ephemeral certificate for the IAM token, the TLS
// tunnel to the instance's server proxy at the address the settings give
// (the private one with private_ip), and the login as the IAM user, with
// no password.
func TestCloudSQLDialledThroughTheConnector(t *testing.T) {
	t.Parallel()
	cluster := pgtest.Shared(t)
	name := databaseName(t, cluster.NewDatabase(t, nil))
	user := cloudsqlproxy.IAMUser(t, cluster, "replication-drain")
	inst := cloudsqlproxy.ForTest(t, cluster, cloudsqlproxy.Config{Users: map[string]string{"drain-token": user}})
	for _, tc := range []struct {
		name      string
		privateIP bool
		dialled   string
	}{
		{"public IP", false, cloudsqlproxy.PublicIP + ":3307"},
		{"private IP", true, cloudsqlproxy.PrivateIP + ":3307"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			pools, err := database.New(database.Config{DialerOptions: inst.DialerOptions("drain-token")})
			require.NoError(t, err)
			defer pools.Close()
			l, err := pools.Acquire(ctx, cloudSQLWorkspace("w1", name, user, tc.privateIP))
			require.NoError(t, err)
			defer l.Release()
			var login, db string
			var ssl bool
			require.NoError(t, l.Pool.QueryRow(ctx, `SELECT current_user, current_database(),
				coalesce((SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()), false)`).Scan(&login, &db, &ssl))
			require.Equal(t, user, login, "logs in as the IAM user the token is the login of")
			require.Equal(t, name, db)
			require.False(t, ssl, "the server sees the proxy's socket; the tunnel's TLS is the connector's")
			dialled := inst.Dialled()
			require.Equal(t, tc.dialled, dialled[len(dialled)-1], "the connector dials the address the connect settings give")
		})
	}
	require.GreaterOrEqual(t, inst.Certificates(), int64(2), "each dialer asks for its own ephemeral certificate")
}

// TestCloudSQLOneInstanceOneBudget: two workspace databases of one
// instance share the per-server budget: with one place, a connection held
// by one workspace's pool makes the other's dial wait (and fail at its
// deadline with ErrServerBusy); once it is idle, the other's dial closes it
// and takes its place.
func TestCloudSQLOneInstanceOneBudget(t *testing.T) {
	t.Parallel()
	cluster := pgtest.Shared(t)
	first, second := databaseName(t, cluster.NewDatabase(t, nil)), databaseName(t, cluster.NewDatabase(t, nil))
	user := cloudsqlproxy.IAMUser(t, cluster, "replication-verify")
	inst := cloudsqlproxy.ForTest(t, cluster, cloudsqlproxy.Config{Users: map[string]string{"verify-token": user}})
	ctx := context.Background()
	pools, err := database.New(database.Config{ServerMaxConns: 1, DialerOptions: inst.DialerOptions("verify-token")})
	require.NoError(t, err)
	defer pools.Close()
	a, err := pools.Acquire(ctx, cloudSQLWorkspace("a", first, user, false))
	require.NoError(t, err)
	defer a.Release()
	b, err := pools.Acquire(ctx, cloudSQLWorkspace("b", second, user, false))
	require.NoError(t, err)
	defer b.Release()

	held, err := a.Pool.Acquire(ctx)
	require.NoError(t, err)
	release := sync.OnceFunc(held.Release)
	defer release() // on a failure too: the pools' Close waits for it
	waitCtx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	err = b.Pool.Ping(waitCtx)
	cancel()
	require.Error(t, err, "the second database of the instance waits for the first's place")
	require.True(t, errors.Is(err, database.ErrServerBusy) || errors.Is(err, context.DeadlineExceeded), "%v", err)

	release()
	require.NoError(t, b.Pool.Ping(ctx), "an idle connection of the other database gives its place up")
	require.Zero(t, a.Pool.Stat().TotalConns(), "the first database's idle connection was closed for it")
}

// TestCloudSQLFailuresNameTheirCause: each way a Cloud SQL connection
// fails is told apart, as the drain's answer needs: a login refused (the
// Admin API refusing the IAM token, a database user missing) and an
// instance without the private IP asked for need a person (not
// transient); the Admin API down is a refresh that may pass.
func TestCloudSQLFailuresNameTheirCause(t *testing.T) {
	t.Parallel()
	cluster := pgtest.Shared(t)
	name := databaseName(t, cluster.NewDatabase(t, nil))
	user := cloudsqlproxy.IAMUser(t, cluster, "replication-job")
	other := cloudsqlproxy.IAMUser(t, cluster, "replication-other")
	const nobody = "replication-nobody@acme.iam"
	for _, tc := range []struct {
		name      string
		login     string // the IAM user, whose token is "token"
		as        string // the user the workspace logs in as ("": login)
		cfg       cloudsqlproxy.Config
		privateIP bool
		fault     func(*cloudsqlproxy.Instance)
		refused   bool
		misconfig bool
		hint      string
	}{
		{name: "IAM token refused", login: user, fault: func(i *cloudsqlproxy.Instance) { i.SetTokensRefused(true) }, refused: true,
			hint: "needs roles/cloudsql.client and roles/cloudsql.instanceUser"},
		{name: "IAM database user missing", login: nobody, refused: true},
		{name: "another IAM user than the token's", login: user, as: other, refused: true, hint: "the certificate is"},
		{name: "no private IP", login: user, cfg: cloudsqlproxy.Config{PublicOnly: true}, privateIP: true, misconfig: true,
			hint: "private_ip without a private IP"},
		{name: "Admin API down", login: user, fault: func(i *cloudsqlproxy.Instance) { i.SetAdminDown(true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.cfg.Users = map[string]string{"token": tc.login}
			inst := cloudsqlproxy.ForTest(t, cluster, tc.cfg)
			if tc.fault != nil {
				tc.fault(inst)
			}
			ctx := context.Background()
			pools, err := database.New(database.Config{DialerOptions: inst.DialerOptions("token")})
			require.NoError(t, err)
			defer pools.Close()
			l, err := pools.Acquire(ctx, cloudSQLWorkspace("w", name, cmp.Or(tc.as, tc.login), tc.privateIP))
			require.NoError(t, err)
			defer l.Release()
			err = l.Pool.Ping(ctx)
			require.Error(t, err)
			require.Equal(t, tc.refused, database.LoginRefused(err), "LoginRefused: %v", err)
			require.Equal(t, tc.misconfig, database.Misconfigured(err), "Misconfigured: %v", err)
			if tc.hint != "" {
				require.ErrorContains(t, err, tc.hint, "the error says what to check")
			}
			// The Admin API down: the refresh's own retries of the 503, or
			// the connect timeout if they outlast it; a connection error
			// either way, which a retry may mend.
			require.ErrorAs(t, err, new(*pgconn.ConnectError))
		})
	}
}

// TestCloudSQLRestartAndRefreshFailing: with connections open, the Admin
// API failing (every new connection's certificate refresh fails) leaves
// them working; the instance restarting drops them, and the pool's next
// connection fails with a refresh error, not a login refused, until the
// Admin API is back, when the pool recovers by itself.
func TestCloudSQLRestartAndRefreshFailing(t *testing.T) {
	t.Parallel()
	cluster := pgtest.Shared(t)
	name := databaseName(t, cluster.NewDatabase(t, nil))
	user := cloudsqlproxy.IAMUser(t, cluster, "replication-drain")
	inst := cloudsqlproxy.ForTest(t, cluster, cloudsqlproxy.Config{Users: map[string]string{"token": user}, CertLifetime: time.Minute})
	ctx := context.Background()
	pools, err := database.New(database.Config{DialerOptions: inst.DialerOptions("token")})
	require.NoError(t, err)
	defer pools.Close()
	l, err := pools.Acquire(ctx, cloudSQLWorkspace("w", name, user, false))
	require.NoError(t, err)
	defer l.Release()
	require.NoError(t, l.Pool.Ping(ctx))
	issued := inst.Certificates()
	// The pool takes a released connection back asynchronously (its
	// release hook is the per-server budget's).
	for deadline := time.Now().Add(10 * time.Second); l.Pool.Stat().IdleConns() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	require.EqualValues(t, 1, l.Pool.Stat().IdleConns())

	inst.SetAdminDown(true)
	require.NoError(t, l.Pool.Ping(ctx), "an open connection outlives a failing refresh")
	require.Equal(t, issued, inst.Certificates())

	require.Positive(t, inst.Restart(), "the restart drops the open connection")
	err = l.Pool.Ping(ctx)
	for try := 0; !errors.As(err, new(*pgconn.ConnectError)) && try < 3; try++ {
		// The pool may hand the dropped connection out once before it
		// notices (unexpected EOF).
		err = l.Pool.Ping(ctx)
	}
	require.Error(t, err)
	require.ErrorAs(t, err, new(*pgconn.ConnectError), "the new connection's refresh meets the Admin API down")
	require.False(t, database.LoginRefused(err) || database.Misconfigured(err), "a refresh failing may pass: %v", err)

	inst.SetAdminDown(false)
	require.NoError(t, l.Pool.Ping(ctx), "the pool recovers once the Admin API is back")
	require.Greater(t, inst.Certificates(), issued, "with a certificate this short-lived, the new connection refreshed it")
}
