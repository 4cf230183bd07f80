package store_test

import (
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// queueSnapshot is every delivery row's and receipt's state, and each
// target's verified_count, by generation and event id.
type queueSnapshot struct {
	rows     map[[2]string][2]bool // (generation, event) → (accepted, verified)
	receipts map[[2]string]bool
	verified map[string]int64
}

func snapshotQueue(t *testing.T, e *env) queueSnapshot {
	t.Helper()
	s := queueSnapshot{rows: map[[2]string][2]bool{}, receipts: map[[2]string]bool{}, verified: map[string]int64{}}
	rows, err := e.pool.Query(e.ctx, `SELECT generation::text, event_id::text, accepted_at IS NOT NULL, verified_at IS NOT NULL FROM _ontology_replication_delivery`)
	require.NoError(t, err)
	var g, id string
	var accepted, verified bool
	_, err = pgx.ForEachRow(rows, []any{&g, &id, &accepted, &verified}, func() error {
		s.rows[[2]string{g, id}] = [2]bool{accepted, verified}
		return nil
	})
	require.NoError(t, err)
	rows, err = e.pool.Query(e.ctx, `SELECT generation::text, event_id::text FROM _ontology_replication_receipts`)
	require.NoError(t, err)
	_, err = pgx.ForEachRow(rows, []any{&g, &id}, func() error {
		s.receipts[[2]string{g, id}] = true
		return nil
	})
	require.NoError(t, err)
	rows, err = e.pool.Query(e.ctx, `SELECT generation::text, verified_count FROM _ontology_replication_targets`)
	require.NoError(t, err)
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&g, &n}, func() error {
		s.verified[g] = n
		return nil
	})
	require.NoError(t, err)
	return s
}

// replayPartial runs an entity's partial-replay pages to the end and
// returns the rows reset and the pages run.
func replayPartial(t *testing.T, e *env, tg store.Target, entity string, sel store.PartialSelection) (rows, pages int) {
	t.Helper()
	after := ""
	for {
		page, err := e.store.ReplayPartialPage(e.ctx, tg, entity, sel, after)
		require.NoError(t, err)
		require.LessOrEqual(t, page.Scanned, store.PartialScanRows)
		rows += page.Rows
		pages++
		if after = page.Next; after == "" {
			return rows, pages
		}
	}
}

// TestReplayPartialResetsExactlyTheSelection: a partial replay of one
// entity since a revision sends back to pending exactly the delivery rows
// of that entity's events (its baselines and history rows) of that
// revision or later that were accepted before the bound, in its
// generation only, across several pages; it drops exactly their receipts
// and subtracts exactly the verified ones from verified_count. Everything
// else — other entities, older revisions, rows accepted after the bound,
// pending rows, another generation's rows of the same events — is as it
// was, row for row. Run again with the same bound it resets nothing; by
// record keys it resets only those records' events.
func TestReplayPartialResetsExactlyTheSelection(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	early := e.products(t, 3) // captured in the baseline
	first := e.start(t)
	e.productsBulk(t, store.PartialScanRows+1200)
	keys := e.products(t, 3)
	customer, err := e.w.Create(e.ctx, "customer", map[string]any{"name": "c"})
	require.NoError(t, err)
	ids := e.drainAll(t, first)
	_, err = e.store.VerifyEvents(e.ctx, first, ids[:len(ids)/2])
	require.NoError(t, err)
	// A few rows pending again (sent back by the verifier, say) and a few
	// accepted after the bound.
	e.exec(t, `UPDATE _ontology_replication_delivery SET accepted_at = NULL, verified_at = NULL
	  WHERE generation = $1::uuid AND event_id IN (SELECT event_id FROM _ontology_replication_delivery ORDER BY event_id DESC LIMIT 7)`, first.Generation)
	e.exec(t, `UPDATE _ontology_replication_targets SET verified_count = (SELECT count(*) FROM _ontology_replication_delivery
	  WHERE generation = $1::uuid AND verified_at IS NOT NULL) WHERE generation = $1::uuid`, first.Generation)
	require.NoError(t, sdkfixture.Pause(e.ctx, e.pool))
	second := e.start(t)
	e.exec(t, `INSERT INTO _ontology_replication_delivery (generation, event_id, history_table, revision, accepted_at, verified_at)
	  SELECT $1::uuid, event_id, history_table, revision, now(), now() FROM _ontology_replication_delivery WHERE generation = $2::uuid
	  ON CONFLICT DO NOTHING`, second.Generation, first.Generation)
	first, err = e.store.Target(e.ctx, first.Generation)
	require.NoError(t, err)

	bound, err := e.store.Now(e.ctx)
	require.NoError(t, err)
	e.exec(t, `UPDATE _ontology_replication_delivery SET accepted_at = $2::timestamptz + interval '1 second'
	  WHERE generation = $1::uuid AND accepted_at IS NOT NULL AND event_id IN (SELECT event_id FROM _ontology_replication_delivery
	  WHERE generation = $1::uuid ORDER BY event_id LIMIT 5)`, first.Generation, bound)
	var since int64
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT revision FROM _ontology_replication_delivery WHERE generation = $1::uuid AND NOT is_baseline
	  ORDER BY revision OFFSET 2000 LIMIT 1`, first.Generation).Scan(&since))
	productHistory, err := sdkfixture.HistoryID(e.ctx, e.pool, sdkfixture.Demo, "product", keys[0], "create")
	require.NoError(t, err)
	var productTable string
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT history_table FROM _ontology_replication_delivery WHERE event_id = $1::uuid`,
		productHistory).Scan(&productTable))

	// expected: the rows the selection names, found through the delivery
	// table's own columns (not the store's event read).
	expected := func(since int64, keys []string, before time.Time) []string {
		rows, err := e.pool.Query(e.ctx, `SELECT d.event_id::text FROM _ontology_replication_delivery d
		  WHERE d.generation = $1::uuid AND d.accepted_at < $4 AND d.revision >= $3
		    AND ((d.history_table = $2 AND ($5::text[] IS NULL OR d.event_id = ANY ($6::uuid[])))
		      OR (d.is_baseline AND d.event_id IN (SELECT id FROM _ontology_replication_baselines
		          WHERE generation = $1::uuid AND event->>'entity_id' = 'ent_product' AND ($5::text[] IS NULL OR event->>'record_key' = ANY ($5)))))`,
			first.Generation, productTable, since, before, keys, historyIDs(t, e, keys))
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	check := func(t *testing.T, before queueSnapshot, want []string) {
		t.Helper()
		after := snapshotQueue(t, e)
		reset := map[string]bool{}
		verified := int64(0)
		for _, id := range want {
			reset[id] = true
			if before.rows[[2]string{first.Generation, id}][1] {
				verified++
			}
		}
		for k, was := range before.rows {
			now := after.rows[k]
			if k[0] == first.Generation && reset[k[1]] {
				require.Equal(t, [2]bool{false, false}, now, "selected row %v back to pending", k)
				require.False(t, after.receipts[k], "selected row %v: receipt dropped", k)
				continue
			}
			require.Equal(t, was, now, "row %v untouched", k)
			require.Equal(t, before.receipts[k], after.receipts[k], "receipt of %v untouched", k)
		}
		require.Equal(t, before.verified[first.Generation]-verified, after.verified[first.Generation], "verified_count keeps true")
		require.Equal(t, before.verified[second.Generation], after.verified[second.Generation])
	}

	t.Run("an entity since a revision", func(t *testing.T) {
		before := snapshotQueue(t, e)
		want := expected(since, nil, bound)
		require.Greater(t, len(want), store.PartialScanRows/2)
		rows, pages := replayPartial(t, e, first, "ent_product", store.PartialSelection{SinceRevision: since, AcceptedBefore: bound})
		require.Equal(t, len(want), rows)
		require.GreaterOrEqual(t, pages, 2, "more events than one page reads")
		check(t, before, want)
		customerRows, _ := replayPartial(t, e, first, "ent_customer", store.PartialSelection{SinceRevision: since + 1_000_000, AcceptedBefore: bound})
		require.Zero(t, customerRows, "nothing of that revision")

		again := snapshotQueue(t, e)
		rows, _ = replayPartial(t, e, first, "ent_product", store.PartialSelection{SinceRevision: since, AcceptedBefore: bound})
		require.Zero(t, rows, "run again with the same bound: nothing reset again")
		check(t, again, nil)
	})

	t.Run("records, baselines included", func(t *testing.T) {
		e.drainAll(t, first)
		now, err := e.store.Now(e.ctx)
		require.NoError(t, err)
		chosen := []string{keys[1], early[0], customer}
		before := snapshotQueue(t, e)
		want := expected(0, chosen, now)
		require.Len(t, want, 2, "the product's create and the early product's baseline (the customer is another entity)")
		rows, _ := replayPartial(t, e, first, "ent_product", store.PartialSelection{Keys: chosen, AcceptedBefore: now})
		require.Equal(t, 2, rows)
		check(t, before, want)
	})

	t.Run("protocol 3", func(t *testing.T) {
		e := newEnv(t, &sdkfixture.V3Template)
		tg := e.start(t)
		ids := e.products(t, 3)
		events := e.drainAll(t, tg)
		require.Len(t, events, 3)
		_, err := e.store.VerifyEvents(e.ctx, tg, events)
		require.NoError(t, err)
		now, err := e.store.Now(e.ctx)
		require.NoError(t, err)
		rows, _ := replayPartial(t, e, tg, "ent_product", store.PartialSelection{Keys: ids[1:2], AcceptedBefore: now})
		require.Equal(t, 1, rows)
		require.EqualValues(t, 2, e.count(t, `SELECT count(*) FROM _ontology_replication_receipts`))
		h, err := sdkfixture.HistoryID(e.ctx, e.pool, sdkfixture.Demo, "product", ids[1], "create")
		require.NoError(t, err)
		require.Zero(t, e.count(t, `SELECT count(*) FROM _ontology_replication_receipts WHERE event_id = $1::uuid`, h))

		// Published again after the bound: a rerun with the same bound
		// leaves it (and the others) alone.
		require.Equal(t, []string{h}, e.drainAll(t, tg))
		rows, _ = replayPartial(t, e, tg, "ent_product", store.PartialSelection{Keys: ids[1:2], AcceptedBefore: now})
		require.Zero(t, rows, "the same selection and bound again: nothing accepted before the bound is left")
		require.EqualValues(t, 3, e.count(t, `SELECT count(*) FROM _ontology_replication_receipts`))
	})
}

// TestPartialPageLocksTheTargetOnlyToReset: a partial-replay page reads its
// selection without the target row's lock, which the verifier takes: a
// page that selects nothing to reset runs while another transaction holds
// that row, and one that has rows to reset waits for it (here, past its
// lock timeout). A page that resets no verified row leaves the target row
// unwritten.
func TestPartialPageLocksTheTargetOnlyToReset(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	keys := e.products(t, 20)
	ids := e.drainAll(t, tg)
	_, err := e.store.VerifyEvents(e.ctx, tg, ids[:10])
	require.NoError(t, err)
	now, err := e.store.Now(e.ctx)
	require.NoError(t, err)
	quick, err := store.New(e.pool, store.Config{LockTimeout: 200 * time.Millisecond})
	require.NoError(t, err)

	verifier, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = verifier.Rollback(e.ctx) }()
	_, err = verifier.Exec(e.ctx, `SELECT 1 FROM _ontology_replication_targets WHERE generation = $1::uuid FOR NO KEY UPDATE`, tg.Generation)
	require.NoError(t, err)
	page, err := quick.ReplayPartialPage(e.ctx, tg, "ent_product", store.PartialSelection{SinceRevision: 1 << 40, AcceptedBefore: now}, "")
	require.NoError(t, err, "a page with nothing to reset takes no target lock")
	require.Equal(t, 20, page.Scanned)
	require.Zero(t, page.Rows)
	_, err = quick.ReplayPartialPage(e.ctx, tg, "ent_product", store.PartialSelection{AcceptedBefore: now}, "")
	require.ErrorContains(t, err, "lock timeout", "a page with rows to reset locks the target row first")
	require.NoError(t, verifier.Rollback(e.ctx))

	var before, after uint32
	target := `SELECT xmin::text::bigint FROM _ontology_replication_targets WHERE generation = $1::uuid`
	require.NoError(t, e.pool.QueryRow(e.ctx, target, tg.Generation).Scan(&before))
	unverified := historyIDs(t, e, keys[15:16])
	require.NotContains(t, ids[:10], unverified[0])
	rows, _ := replayPartial(t, e, tg, "ent_product", store.PartialSelection{Keys: keys[15:16], AcceptedBefore: now})
	require.Equal(t, 1, rows)
	require.NoError(t, e.pool.QueryRow(e.ctx, target, tg.Generation).Scan(&after))
	require.Equal(t, before, after, "no verified row reset: the target row is not written")
}

// historyIDs are the history ids of the records' events in the product
// history (nil for no keys).
func historyIDs(t *testing.T, e *env, keys []string) []string {
	t.Helper()
	if keys == nil {
		return nil
	}
	var out []string
	for _, k := range keys {
		for _, kind := range []string{"create", "update", "delete"} {
			if id, err := sdkfixture.HistoryID(e.ctx, e.pool, sdkfixture.Demo, "product", k, kind); err == nil {
				out = append(out, id)
			}
		}
	}
	slices.Sort(out)
	return out
}
