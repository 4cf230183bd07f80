package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestClaimUsesGenericPlans: the claim's statements are planned once per
// connection, not at every claim. PostgreSQL's plan cache plans a prepared
// statement afresh for its first five runs and may go on doing so; the
// candidates' statement costs about three times as much to plan as to run.
// The server's own count (pg_prepared_statements on the claims'
// connection) says how each run was planned.
func TestClaimUsesGenericPlans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.NewDatabase(t, &sdkfixture.V4Template)+"&pool_max_conns=1")
	require.NoError(t, err)
	closeBounded(t, pool)
	st, err := store.New(pool, store.Config{})
	require.NoError(t, err)
	_, err = sdkfixture.StartGeneration(ctx, pool, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
	require.NoError(t, err)
	w := sdkfixture.NewWriter(pool, sdkfixture.Demo)
	const claims = 8
	for i := range claims {
		_, err := w.Create(ctx, "product", map[string]any{"title": fmt.Sprint("p", i)})
		require.NoError(t, err)
		_, _, c, err := st.ClaimActive(ctx)
		require.NoError(t, err)
		require.NotNil(t, c)
		require.Len(t, c.Events, 1, "claim %d", i)
		_, err = c.Finish(ctx, c.IDs(), nil)
		require.NoError(t, err)
	}
	var generic, custom int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT sum(generic_plans)::bigint, sum(custom_plans)::bigint FROM pg_prepared_statements
		WHERE statement LIKE 'WITH candidates AS MATERIALIZED%'`).Scan(&generic, &custom))
	require.Zero(t, custom, "the candidates' statement planned for its parameters")
	require.GreaterOrEqual(t, generic, int64(claims), "every claim ran the generic plan")
}

// TestClaimGenericPlanReadsByIndex: the candidates' statement's generic
// plan, the one every claim runs (TestClaimUsesGenericPlans), walks the
// pending index from the oldest, locks what others touched by primary key
// and reads each event by its history table's primary key, with 2,000
// pending events of 3,000.
func TestClaimGenericPlanReadsByIndex(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	require.NoError(t, sdkfixture.BulkCreate(e.ctx, e.pool, sdkfixture.Demo, "product", "title", 3000, 50_000))
	_, err := e.pool.Exec(e.ctx, `UPDATE _ontology_replication_delivery SET accepted_at = now()
		WHERE revision <= (SELECT min(revision) + 999 FROM _ontology_replication_delivery)`)
	require.NoError(t, err)
	_, err = e.pool.Exec(e.ctx, `ANALYZE`)
	require.NoError(t, err)
	plan := e.genericPlan(t, store.CandidatesReading(`"product_history"`), "uuid, text, bigint[], text[], text, int4[]",
		fmt.Sprintf(`NULL, '%s', '{%s}', '{product_history}', '60000ms', '{}'`, store.ClaimLockClass, backoffsLiteral(e.store)))
	require.Contains(t, plan, "Index Scan using _ontology_delivery_pending", plan)
	require.Contains(t, plan, "LockRows", plan)
	require.Contains(t, plan, "Index Scan using _ontology_replication_delivery_pkey", "rows others touched locked by key")
	require.Contains(t, plan, "Index Scan using product_history_pkey", plan)
	require.NotContains(t, plan, "Seq Scan on _ontology_replication_delivery", plan)
}
