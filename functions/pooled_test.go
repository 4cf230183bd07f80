package functions

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/pgbouncer"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
)

// startPooler starts a PgBouncer in session mode in front of the cluster,
// accepting its superuser (the workspaces' URLs' login).
func startPooler(t *testing.T, cluster *pgtest.Cluster) *pgbouncer.Server {
	t.Helper()
	admin, err := url.Parse(cluster.AdminURL())
	require.NoError(t, err)
	password, _ := admin.User.Password()
	p, err := pgbouncer.Start(t.Context(), pgbouncer.Config{Server: admin.Host, Users: map[string]string{admin.User.Username(): password},
		Settings: map[string]string{"default_pool_size": "4", "server_idle_timeout": "60"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Stop() })
	return p
}

// poolerURL is the database of dbURL through the pooler.
func poolerURL(t *testing.T, p *pgbouncer.Server, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	password, _ := u.User.Password()
	return p.URL(u.User.Username(), password, strings.TrimPrefix(u.Path, "/"))
}

// TestWakeUpsDrainThroughAPooler: a workspace whose registry entry is
// pooled is drained through a PgBouncer in session mode (which refuses
// the startup parameters a direct connection sends), with its claims'
// session locks; and a drainer's client connection is closed at the end of
// its run, its server session going back to the pooler (the server shows
// its reset, DISCARD ALL) to serve the next run: four runs, each on a
// client connection of its own, on one server session.
func TestWakeUpsDrainThroughAPooler(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withPooler())
	// The pooler's server sessions, once their client has gone.
	reset := func() []int64 {
		rows, err := h.spaces["w1"].pool.Query(h.ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()
			AND backend_type = 'client backend' AND query = 'DISCARD ALL' AND state = 'idle'`)
		require.NoError(t, err)
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		return pids
	}
	servers := map[int64]bool{}
	for round := range 4 {
		h.products("w1", 3)
		status, body := h.wake("w1")
		require.Equal(t, 200, status, "%v", body)
		h.settle()
		require.Zero(t, h.count("w1", `SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL`), "round %d", round)
		var pids []int64
		require.Eventually(t, func() bool { pids = reset(); return len(pids) > 0 }, 15*time.Second, 10*time.Millisecond,
			"the drainer's client connection is closed at the end of its run")
		for _, pid := range pids {
			servers[pid] = true
		}
	}
	require.Len(t, h.published("w1"), 12)
	require.Len(t, servers, 1, "one server session serves the four runs")
}
