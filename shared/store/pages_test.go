package store_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/store"
)

// walk reads pages to the end with one page query per cursor state and
// returns every id in order.
func walk(t *testing.T, e *env, first, next string, args func(cursor *string) []any) []string {
	t.Helper()
	var all []string
	var cursor *string
	for {
		q := next
		if cursor == nil {
			q = first
		}
		rows, err := e.pool.Query(e.ctx, q, args(cursor)...)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			vals, err := r.Values()
			return vals[0].(string), err
		})
		require.NoError(t, err)
		all = append(all, ids...)
		if len(ids) < 1000 {
			return all
		}
		cursor = &ids[len(ids)-1]
	}
}

// TestPageReadsMatchTheSeeds: the store's split page reads select exactly
// the rows of the seeds' statements, page by page, in the same order.
func TestPageReadsMatchTheSeeds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V3Template)
	require.NoError(t, sdkfixture.BulkCreate(e.ctx, e.pool, sdkfixture.Demo, "product", "title", 1500, 1000)) // baseline
	tg := e.start(t)
	require.NoError(t, sdkfixture.BulkCreate(e.ctx, e.pool, sdkfixture.Demo, "product", "title", 2500, 1000))
	require.NoError(t, sdkfixture.Upgrade(e.ctx, e.pool, sdkfixture.Demo))
	e.products(t, 10) // after the upgrade: outside the backfill range
	var backfillRevision int64
	require.NoError(t, e.pool.QueryRow(e.ctx, "SELECT backfill_revision FROM _ontology_replication_targets").Scan(&backfillRevision))

	baseline := func(c *string) []any { return []any{tg.Generation, c} }
	seed := walk(t, e, store.SeedBackfillBaselinePage, store.SeedBackfillBaselinePage, baseline)
	ours := walk(t, e, store.BackfillBaselinePages[0], store.BackfillBaselinePages[1], baseline)
	require.Len(t, seed, 1500)
	require.Equal(t, seed, ours)

	history := func(c *string) []any {
		return []any{tg.Generation, c, tg.SourceID, tg.FromRevision, backfillRevision}
	}
	table := `"product_history"`
	seed = walk(t, e, fmt.Sprintf(store.SeedBackfillHistoryPage, table), fmt.Sprintf(store.SeedBackfillHistoryPage, table), history)
	ours = walk(t, e, fmt.Sprintf(store.BackfillHistoryPages[0], table), fmt.Sprintf(store.BackfillHistoryPages[1], table), history)
	require.Len(t, seed, 2500)
	require.Equal(t, seed, ours)

	tg = e.target(t)
	for page := (store.BackfillPage{}); !page.Complete; {
		var err error
		page, err = e.store.AdvanceBackfill(e.ctx, tg)
		require.NoError(t, err)
	}
	fence := int64(2500 + 5) // history revisions 1–2,500, then 2,501–2,510 after the upgrade
	replay := func(c *string) []any { return []any{tg.Generation, c, fence} }
	seed = walk(t, e, store.SeedReplayPage, store.SeedReplayPage, replay)
	ours = walk(t, e, store.ReplayPages[0], store.ReplayPages[1], replay)
	require.Len(t, seed, 1500+2500+5, "baselines, backfilled history and five later events at or below the fence")
	require.Equal(t, seed, ours)
}
