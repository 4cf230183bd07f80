package pgbouncer_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/pgbouncer"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestSessionModeSharesAServerConnection: two clients, one after the
// other, reach the server through PgBouncer on one server session, and
// session state (an advisory lock) does not outlive its client.
func TestSessionModeSharesAServerConnection(t *testing.T) {
	if _, err := pgbouncer.Binary(pgbouncer.Config{}); errors.Is(err, pgbouncer.ErrNotInstalled) {
		t.Skip(err)
	}
	ctx := context.Background()
	cluster := pgtest.Shared(t)
	require.NoError(t, cluster.Exec(ctx, `DO $$ BEGIN CREATE ROLE pooled LOGIN PASSWORD 'pooled'; EXCEPTION WHEN duplicate_object THEN NULL; END $$`))
	b, err := pgbouncer.Start(ctx, pgbouncer.Config{Server: "127.0.0.1:" + itoa(cluster.Port()), Users: map[string]string{"pooled": "pooled"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Stop() })
	pids := map[uint32]bool{}
	for range 2 {
		conn, err := pgx.Connect(ctx, b.URL("pooled", "pooled", "postgres"))
		require.NoError(t, err, b.Log())
		var held bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT NOT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())`).Scan(&held))
		require.True(t, held, "no advisory lock of an earlier client")
		_, err = conn.Exec(ctx, `SELECT pg_advisory_lock(42)`)
		require.NoError(t, err)
		var pid uint32
		require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid)) // the client's PID is PgBouncer's own key
		pids[pid] = true
		require.NoError(t, conn.Close(ctx))
	}
	require.Len(t, pids, 1, "the second client was given the first's server session")
}

func itoa(n int) string { return strconv.Itoa(n) }
