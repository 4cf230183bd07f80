package pgtest_test

import (
	"context"
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
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, c.Stop())
	_, err = pgx.Connect(ctx, url)
	require.Error(t, err, "the server is gone after Stop")
}
