package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestPagesVacuumTheTargetTable advances TargetVacuumEvery replay pages and
// finds the target table vacuumed by the store (pg_stat_user_tables counts
// manual VACUUMs apart from autovacuum's), and the replay still completes.
func TestPagesVacuumTheTargetTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	require.NoError(t, sdkfixture.BulkCreate(e.ctx, e.pool, sdkfixture.Demo, "product", "title", store.TargetVacuumEvery*store.ReplayPageSize, 10_000))
	const vacuums = `SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = '_ontology_replication_targets'`
	require.Zero(t, e.count(t, vacuums))

	require.NoError(t, e.store.InitReplay(e.ctx, tg))
	pages := 0
	for {
		page, err := e.store.AdvanceReplay(e.ctx, tg)
		require.NoError(t, err)
		if page.Rows > 0 {
			pages++
		}
		if pages == store.TargetVacuumEvery-1 {
			// Statistics reach the view within a second of a statement.
			time.Sleep(1500 * time.Millisecond)
			require.Zero(t, e.count(t, vacuums), "no VACUUM before the %dth page", store.TargetVacuumEvery)
		}
		if page.Complete {
			break
		}
	}
	require.Equal(t, store.TargetVacuumEvery, pages)
	require.Eventually(t, func() bool { return e.count(t, vacuums) == 1 }, 15*time.Second, 100*time.Millisecond,
		"one VACUUM after %d pages", store.TargetVacuumEvery)
	require.EqualValues(t, 1, e.count(t, "SELECT count(*) FROM _ontology_replication_targets WHERE replay_complete"))
}
