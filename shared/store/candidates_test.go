package store_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestClaimReadKeepsOnlyRowsStillPending: locks do not honour snapshots,
// so a claim's candidates may include an event that was acknowledged after
// they were read (here by the SDK's own acknowledgement, which honours no
// claim lock). The claim's second statement, a snapshot taken after the
// locks, leaves it out: it is never published again. A row updated but
// still pending is read and published as any other. The read finds the
// delivery rows by primary key (see Finding rows by key in the package
// doc), in its custom plan and in its generic one.
func TestClaimReadKeepsOnlyRowsStillPending(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	require.NoError(t, sdkfixture.BulkCreate(e.ctx, e.pool, sdkfixture.Demo, "product", "title", 2_000, 2_000))
	e.exec(t, "VACUUM ANALYZE _ontology_replication_delivery")
	rows, err := e.pool.Query(e.ctx, `SELECT event_id::text FROM _ontology_replication_delivery ORDER BY revision, event_id LIMIT 100`)
	require.NoError(t, err)
	first, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)

	read, release, err := e.store.ClaimInTwoSteps(e.ctx, tg)
	require.NoError(t, err)
	defer release()
	accepted, touched := first[0], first[1]
	_, err = e.pool.Exec(e.ctx, store.SeedStateUpdates[0], tg.Generation, `["`+accepted+`"]`)
	require.NoError(t, err)
	e.exec(t, `UPDATE _ontology_replication_delivery SET next_verify_at = now() WHERE event_id = $1`, touched)
	got, err := read()
	require.NoError(t, err)
	require.ElementsMatch(t, first[1:], got, "every claimed row but the one acknowledged meanwhile")

	query := fmt.Sprintf(store.ClaimedHistoryRead, `"product_history"`)
	for _, generic := range []bool{false, true} {
		t.Run(fmt.Sprintf("generic=%v", generic), func(t *testing.T) {
			var plan string
			if generic {
				plan = e.genericPlan(t, query, "uuid, uuid[], bigint[]",
					fmt.Sprintf(`'%s', '{%s}', '{%s}'`, tg.Generation, strings.Join(first, ","), backoffsLiteral(e.store)))
			} else {
				rows, err := e.pool.Query(e.ctx, "EXPLAIN "+query, tg.Generation, first, store.Backoffs(e.store))
				require.NoError(t, err)
				lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
				require.NoError(t, err)
				plan = strings.Join(lines, "\n")
			}
			require.Contains(t, plan, "Index Scan using _ontology_replication_delivery_pkey", plan)
			require.NotContains(t, plan, "Seq Scan", plan)
		})
	}
}

// TestCandidatesSortByUUID: the claim's page of candidates is put in queue
// order by the uuid, not by the text it returns under the same name, which
// would sort by the database's collation (strcoll under en_US.UTF-8, where
// this test cluster's C locale compares bytes).
func TestCandidatesSortByUUID(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 3)
	// EXPLAIN without ANALYZE: nothing runs, no lock is taken.
	rows, err := e.pool.Query(e.ctx, "EXPLAIN (VERBOSE) "+store.FirstCandidates, tg.Generation, store.ClaimLockClass, store.Backoffs(e.store), []string{}, "60000ms", []int32{})
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	require.Contains(t, plan, "Sort Key: candidates.revision, candidates.event_id\n", plan)
}
