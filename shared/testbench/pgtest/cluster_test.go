package pgtest_test

import (
	"context"
	"net/url"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var tpl = pgtest.Template{Name: "counter", Build: func(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE TABLE t (n int); INSERT INTO t VALUES (1)")
	return err
}}

func TestDatabasesAreIsolatedCopiesOfTheTemplate(t *testing.T) {
	ctx := context.Background()
	a := pgtest.NewDatabase(t, &tpl)
	b := pgtest.NewDatabase(t, &tpl)
	require.NotEqual(t, a, b)
	ca, err := pgx.Connect(ctx, a)
	require.NoError(t, err)
	defer ca.Close(ctx)
	_, err = ca.Exec(ctx, "INSERT INTO t VALUES (2)")
	require.NoError(t, err)
	cb, err := pgx.Connect(ctx, b)
	require.NoError(t, err)
	defer cb.Close(ctx)
	var n int
	require.NoError(t, cb.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n))
	require.Equal(t, 1, n, "a write to one test database is not seen in another")
	var version int
	require.NoError(t, cb.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version))
	require.GreaterOrEqual(t, version, 150000)
}

func TestStartStop(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a second cluster")
	}
	t.Setenv("DATABASE_URL", "")
	ctx := context.Background()
	c, err := pgtest.Start(ctx, pgtest.Config{})
	require.NoError(t, err)
	url, err := c.CreateDatabase(ctx, "x", "")
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	// A restart ends the session; the server comes back on the same URL
	// with the same data.
	_, err = conn.Exec(ctx, "CREATE TABLE kept (n int)")
	require.NoError(t, err)
	sessions, err := c.Restart(ctx)
	require.NoError(t, err)
	require.Positive(t, sessions, "the open session counted")
	_, err = conn.Exec(ctx, "SELECT 1")
	require.Error(t, err, "the session was ended by the restart")
	require.NoError(t, conn.Close(ctx))
	conn, err = pgx.Connect(ctx, url)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SELECT count(*) FROM kept")
	require.NoError(t, err, "the data survived the restart")
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, c.Stop())
	_, err = pgx.Connect(ctx, url)
	require.Error(t, err, "the server is gone after Stop")
}

// TestOnlyTheTestMayLogIn: the throwaway server trusts no one who can
// merely reach 127.0.0.1 — over TCP the superuser needs the random
// password of the admin URL — and its trusted Unix socket is in a
// directory only the server's user may enter.
func TestOnlyTheTestMayLogIn(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a second cluster")
	}
	t.Setenv("DATABASE_URL", "")
	ctx := context.Background()
	c, err := pgtest.Start(ctx, pgtest.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	admin, err := url.Parse(c.AdminURL())
	require.NoError(t, err)
	password, ok := admin.User.Password()
	require.True(t, ok, "the admin URL carries the password")
	require.GreaterOrEqual(t, len(password), 20)

	for _, tc := range []struct {
		name string
		user *url.Userinfo
	}{
		{"superuser without password", url.User("postgres")},
		{"superuser with a wrong password", url.UserPassword("postgres", "postgres")},
		{"another role without password", url.User("nobody")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := *admin
			u.User = tc.user
			conn, err := pgx.Connect(ctx, u.String())
			if err == nil {
				_ = conn.Close(ctx)
			}
			require.ErrorContains(t, err, "authentication failed")
		})
	}

	conn, err := pgx.Connect(ctx, admin.String())
	require.NoError(t, err)
	defer conn.Close(ctx)
	var socketDir string
	require.NoError(t, conn.QueryRow(ctx, "SHOW unix_socket_directories").Scan(&socketDir))
	info, err := os.Stat(socketDir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), info.Mode().Perm(), "%s: only the server's user may reach the trusted socket", socketDir)
}
