package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
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
			if err != nil {
				return "", err
			}
			switch id := vals[0].(type) {
			case string: // the seeds' reads return id::text
				return id, nil
			case [16]byte: // the store's return the uuid with its event
				return fmt.Sprintf("%x-%x-%x-%x-%x", id[0:4], id[4:6], id[6:8], id[8:10], id[10:16]), nil
			default:
				return "", fmt.Errorf("unexpected id %T", id)
			}
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

}

// upgradedTemplate is a protocol-3 database with baselines, history and
// receipts (some verified), upgraded to 4: a target waiting for backfill.
var upgradedTemplate = pgtest.Template{Name: "store_upgraded", Build: func(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if err := sdkfixture.Install(ctx, conn, sdkfixture.Demo, 3); err != nil {
		return err
	}
	if err := sdkfixture.BulkCreate(ctx, conn, sdkfixture.Demo, "product", "title", 1200, 1200); err != nil {
		return err
	}
	g, err := sdkfixture.StartGeneration(ctx, conn, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
	if err != nil {
		return err
	}
	if err := sdkfixture.BulkCreate(ctx, conn, sdkfixture.Demo, "product", "title", 2300, 1000); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, `INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at, verified_at)
		SELECT $1::uuid, id, now(), CASE WHEN random() < 0.5 THEN now() END FROM (
		  SELECT id FROM product_history WHERE replication IS NOT NULL
		  UNION ALL SELECT id FROM _ontology_replication_baselines) e WHERE random() < 0.7`, g.Generation); err != nil {
		return err
	}
	return sdkfixture.Upgrade(ctx, conn, sdkfixture.Demo)
}}

// TestBackfillMatchesTheSeed runs a whole backfill with the seed's
// statements on one copy of a database and with the store on another: the
// delivery queue and the target end the same.
func TestBackfillMatchesTheSeed(t *testing.T) {
	t.Parallel()
	seedEnv, ours := newEnv(t, &upgradedTemplate), newEnv(t, &upgradedTemplate)
	tg := seedEnv.target(t)
	var backfillRevision int64
	require.NoError(t, seedEnv.pool.QueryRow(seedEnv.ctx, "SELECT backfill_revision FROM _ontology_replication_targets").Scan(&backfillRevision))

	// The seed's advanceReplicationBackfill, statement for statement.
	tables := []string{"", "customer_history", "product_history", "order_history"}
	for position := 0; position < len(tables); position++ {
		var cursor *string
		for {
			table := tables[position]
			var rows pgx.Rows
			var err error
			var events string
			if table == "" {
				rows, err = seedEnv.pool.Query(seedEnv.ctx, store.SeedBackfillBaselinePage, tg.Generation, cursor)
				events = store.SeedBackfillEvents[0]
			} else {
				ident := pgx.Identifier{table}.Sanitize()
				rows, err = seedEnv.pool.Query(seedEnv.ctx, fmt.Sprintf(store.SeedBackfillHistoryPage, ident), tg.Generation, cursor, tg.SourceID, tg.FromRevision, backfillRevision)
				events = fmt.Sprintf(store.SeedBackfillEvents[1], ident)
			}
			require.NoError(t, err)
			ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			raw, _ := json.Marshal(ids)
			var historyTable *string
			if table != "" {
				historyTable = &table
			}
			seedEnv.exec(t, fmt.Sprintf(store.SeedBackfillInsert, events), tg.Generation, string(raw), historyTable, table == "")
			finished := len(ids) < 1000
			next := map[string]any{"table": position}
			if finished {
				next = map[string]any{"table": position + 1}
			} else {
				next["id"] = ids[len(ids)-1]
			}
			rawNext, _ := json.Marshal(next)
			seedEnv.exec(t, store.SeedBackfillCursor, tg.Generation, string(rawNext), finished && position+1 >= len(tables))
			if finished {
				break
			}
			cursor = &ids[len(ids)-1]
		}
	}
	for page := (store.BackfillPage{}); !page.Complete; {
		var err error
		page, err = ours.store.AdvanceBackfill(ours.ctx, tg)
		require.NoError(t, err)
	}
	snapshot := func(e *env) string {
		var out string
		require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT concat_ws(E'\n',
			(SELECT string_agg(concat_ws(' ', event_id, history_table, revision, is_baseline, accepted_at, verified_at), E'\n' ORDER BY event_id)
			   FROM _ontology_replication_delivery),
			(SELECT concat_ws(' ', backfill_complete, backfill_cursor, verified_count) FROM _ontology_replication_targets))`).Scan(&out))
		return out
	}
	want, got := snapshot(seedEnv), snapshot(ours)
	require.Equal(t, 1200+2300, strings.Count(want, "\n"), "every event queued")
	require.Equal(t, want, got)
}

// replayingTemplate is a protocol-4 database whose replay was just
// initialised: baselines and history rows in every delivery state (pending,
// accepted, verified, with receipts), then rows written after the fence.
var replayingTemplate = pgtest.Template{Name: "store_replaying", Build: func(ctx context.Context, url string) error {
	conn, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := sdkfixture.Install(ctx, conn, sdkfixture.Demo, 4); err != nil {
		return err
	}
	if err := sdkfixture.BulkCreate(ctx, conn, sdkfixture.Demo, "product", "title", 300, 300); err != nil {
		return err
	}
	g, err := sdkfixture.StartGeneration(ctx, conn, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
	if err != nil {
		return err
	}
	if err := sdkfixture.BulkCreate(ctx, conn, sdkfixture.Demo, "product", "title", 2200, 1000); err != nil {
		return err
	}
	// A fixed mix of states: every fifth row pending, every second of the
	// rest verified, the others accepted and waiting for verification.
	state := `UPDATE _ontology_replication_delivery d SET
	    accepted_at = CASE WHEN s.n %% 5 <> 0 THEN timestamptz '2026-01-01' END,
	    verified_at = CASE WHEN s.n %% 5 <> 0 AND s.n %% 2 = 0 THEN timestamptz '2026-01-02' END
	  FROM (SELECT event_id, row_number() OVER (ORDER BY event_id) AS n FROM _ontology_replication_delivery %s) s
	  WHERE d.event_id = s.event_id`
	receipts := `INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at, verified_at)
	  SELECT generation, event_id, accepted_at, verified_at FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL
	  ON CONFLICT DO NOTHING`
	for _, q := range []string{fmt.Sprintf(state, ""), receipts,
		`UPDATE _ontology_replication_targets SET verified_count = (SELECT count(verified_at) FROM _ontology_replication_delivery)`} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return err
		}
	}
	st, err := store.New(conn, store.Config{})
	if err != nil {
		return err
	}
	tg, err := st.Target(ctx, g.Generation)
	if err != nil {
		return err
	}
	if err := st.InitReplay(ctx, tg); err != nil {
		return err
	}
	var fence int64
	if err := conn.QueryRow(ctx, "SELECT initial_revision FROM _ontology_replication_targets").Scan(&fence); err != nil {
		return err
	}
	if err := sdkfixture.BulkCreate(ctx, conn, sdkfixture.Demo, "product", "title", 60, 60); err != nil {
		return err
	}
	for _, q := range []string{fmt.Sprintf(state, fmt.Sprintf("WHERE revision > %d", fence)), receipts} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}}

// TestReplayMatchesTheSeed runs a whole replay with the seed's statements on
// one copy of a database and with the store on another: the delivery queue,
// the receipts and the target end the same.
func TestReplayMatchesTheSeed(t *testing.T) {
	t.Parallel()
	seedEnv, ours := newEnv(t, &replayingTemplate), newEnv(t, &replayingTemplate)
	tg := seedEnv.target(t)

	// The seed's advanceReplicationReplay, statement for statement.
	var seedPages []store.ReplayPage
	for {
		var complete bool
		var cursor *string
		var fence int64
		require.NoError(t, seedEnv.pool.QueryRow(seedEnv.ctx, "SELECT replay_complete, replay_cursor::text, initial_revision FROM _ontology_replication_targets").
			Scan(&complete, &cursor, &fence))
		if complete {
			break
		}
		rows, err := seedEnv.pool.Query(seedEnv.ctx, store.SeedReplay[0], tg.Generation, cursor, fence)
		require.NoError(t, err)
		var ids []string
		var page store.ReplayPage
		var id string
		var verified bool
		_, err = pgx.ForEachRow(rows, []any{&id, &verified}, func() error {
			ids = append(ids, id)
			if verified {
				page.Verified++
			}
			return nil
		})
		require.NoError(t, err)
		raw, _ := json.Marshal(ids)
		seedEnv.exec(t, store.SeedReplay[1], tg.Generation, string(raw))
		seedEnv.exec(t, store.SeedReplay[2], tg.Generation, string(raw))
		page.Rows, page.Complete = len(ids), len(ids) < 1000
		if len(ids) > 0 {
			cursor = &ids[len(ids)-1]
		}
		seedEnv.exec(t, store.SeedReplay[3], tg.Generation, cursor, page.Complete, page.Verified)
		seedPages = append(seedPages, page)
	}
	var ourPages []store.ReplayPage
	for {
		page, err := ours.store.AdvanceReplay(ours.ctx, tg)
		require.NoError(t, err)
		ourPages = append(ourPages, page)
		if page.Complete {
			break
		}
	}
	require.Equal(t, seedPages, ourPages)
	require.Len(t, ourPages, 3, "2,500 rows at or below the fence")

	snapshot := func(e *env) string {
		var out string
		require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT concat_ws(E'\n',
			(SELECT string_agg(concat_ws(' ', event_id, revision, is_baseline, accepted_at, verified_at, next_verify_at > now() - interval '1 hour'), E'\n' ORDER BY event_id)
			   FROM _ontology_replication_delivery),
			(SELECT string_agg(concat_ws(' ', event_id, accepted_at, verified_at), E'\n' ORDER BY event_id) FROM _ontology_replication_receipts),
			(SELECT concat_ws(' ', replay_complete, replay_cursor, initial_revision, verified_count) FROM _ontology_replication_targets))`).Scan(&out))
		return out
	}
	want, got := snapshot(seedEnv), snapshot(ours)
	require.Equal(t, want, got)
	require.EqualValues(t, 0, ours.count(t, `SELECT count(*) FROM _ontology_replication_delivery d, _ontology_replication_targets t
		WHERE (d.is_baseline OR d.revision <= t.initial_revision) AND d.accepted_at IS NOT NULL`), "every fenced row is pending")
	require.EqualValues(t, 48, ours.count(t, `SELECT count(*) FROM _ontology_replication_delivery d, _ontology_replication_targets t
		WHERE d.revision > t.initial_revision AND d.accepted_at IS NOT NULL`), "rows after the fence keep their state")
}

// TestStateUpdatesMatchTheSeed runs the seed's acknowledge, verify and retry
// statements on one copy of a database holding every delivery state and the
// store's on another, over overlapping id lists: the queue, the receipts and
// the target end the same.
func TestStateUpdatesMatchTheSeed(t *testing.T) {
	t.Parallel()
	seedEnv, ours := newEnv(t, &replayingTemplate), newEnv(t, &replayingTemplate)
	tg := seedEnv.target(t)
	rows, err := seedEnv.pool.Query(seedEnv.ctx, "SELECT event_id::text FROM _ontology_replication_delivery ORDER BY event_id")
	require.NoError(t, err)
	all, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	lists := [3][]string{all[:400], all[200:700], all[600:1100]} // acknowledge, verify, retry
	for i, e := range []*env{seedEnv, ours} {
		statements := store.SeedStateUpdates
		if i == 1 {
			statements = store.StateUpdates
		}
		for j, q := range statements {
			var list any = lists[j] // the store's take a uuid[]
			if i == 0 {
				raw, _ := json.Marshal(lists[j]) // the seed's a JSON array
				list = string(raw)
			}
			e.exec(t, q, tg.Generation, list)
		}
	}
	snapshot := func(e *env) string {
		var out string
		require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT concat_ws(E'\n',
			(SELECT string_agg(concat_ws(' ', event_id, accepted, verified,
			   next_verify_at > now() + interval '10 seconds', last_checked_at IS NOT NULL), E'\n' ORDER BY event_id)
			   FROM (SELECT event_id, next_verify_at, last_checked_at,
			           CASE WHEN accepted_at IS NULL THEN 'pending' WHEN accepted_at < timestamptz '2026-06-01' THEN accepted_at::text ELSE 'now' END AS accepted,
			           CASE WHEN verified_at IS NULL THEN 'unverified' WHEN verified_at < timestamptz '2026-06-01' THEN verified_at::text ELSE 'now' END AS verified
			         FROM _ontology_replication_delivery) d),
			(SELECT string_agg(concat_ws(' ', event_id, accepted_at IS NOT NULL, verified_at IS NOT NULL), E'\n' ORDER BY event_id) FROM _ontology_replication_receipts),
			(SELECT verified_count::text FROM _ontology_replication_targets))`).Scan(&out))
		return out
	}
	want, got := snapshot(seedEnv), snapshot(ours)
	require.True(t, want == got, "the store's statements left another state than the seed's")
	for _, state := range []string{"pending unverified", "now unverified", "now now", "2026-01-01 00:00:00+00 now", "2026-01-02", " t t"} {
		require.True(t, strings.Contains(want, state), "no row in the state %q", state)
	}
}

// TestStateUpdatesUsePrimaryKey: the store's acknowledge, verify and retry
// statements find their rows by primary key, for a drain's list of 100 ids
// and a verifier's of 1,000, with statistics taken while the partial indexes
// were nearly empty and a queue that has since filled them (the seed's
// statements scanned a partial index) and on a table small enough that a
// scan of it looks cheaper than 1,000 lookups (a uuid[] given as is was
// matched by a sequential scan).
func TestStateUpdatesUsePrimaryKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	require.NoError(t, sdkfixture.BulkCreate(e.ctx, e.pool, sdkfixture.Demo, "product", "title", 20_000, 20_000))
	e.exec(t, `ALTER TABLE _ontology_replication_delivery SET (autovacuum_enabled = false)`)
	e.exec(t, `UPDATE _ontology_replication_delivery SET accepted_at = now(), verified_at = now()`)
	e.exec(t, `VACUUM ANALYZE _ontology_replication_delivery`)
	rows, err := e.pool.Query(e.ctx, "SELECT event_id::text FROM _ontology_replication_delivery ORDER BY revision LIMIT 1000")
	require.NoError(t, err)
	all, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := func(q string, list any) string {
		rows, err := e.pool.Query(e.ctx, "EXPLAIN "+q, tg.Generation, list)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return strings.Join(lines, "\n")
	}
	for i, state := range []string{
		`accepted_at = NULL, verified_at = NULL`,  // a replay made everything pending
		`accepted_at = now(), verified_at = NULL`, // then everything was published
		`accepted_at = now(), verified_at = NULL`, // and waits for verification
	} {
		e.exec(t, `UPDATE _ontology_replication_delivery SET `+state)
		for _, n := range []int{100, 1000} {
			ids := all[:n]
			raw, _ := json.Marshal(ids)
			seed, ours := plan(store.SeedStateUpdates[i], string(raw)), plan(store.StateUpdates[i], ids)
			t.Logf("the seed's plan for %d ids:\n%s", n, seed)
			require.Contains(t, ours, "Index Scan using _ontology_replication_delivery_pkey", ours)
			require.NotContains(t, ours, "Seq Scan on _ontology_replication_delivery", ours)
			for _, partial := range []string{"_ontology_delivery_pending", "_ontology_delivery_verify", "_ontology_delivery_unverified", "_ontology_delivery_initial"} {
				require.NotContains(t, ours, partial, ours)
			}
		}
	}
}

// TestReplayPageUsesPrimaryKey: a replay page resets its rows and deletes
// their receipts by primary key. Written as a join to the page, PostgreSQL
// hash-joined a sequential scan of each whole table instead, below about
// half a million rows: 60 of a page's 75 ms at 100,000 rows.
func TestReplayPageUsesPrimaryKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	require.NoError(t, sdkfixture.BulkCreate(e.ctx, e.pool, sdkfixture.Demo, "product", "title", 20_000, 20_000))
	e.exec(t, `UPDATE _ontology_replication_delivery SET accepted_at = now(), verified_at = now()`)
	e.exec(t, `INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at, verified_at)
		SELECT generation, event_id, accepted_at, verified_at FROM _ontology_replication_delivery`)
	e.exec(t, `VACUUM ANALYZE`)
	require.NoError(t, e.store.InitReplay(e.ctx, tg))
	explain := func(q string, args ...any) string {
		rows, err := e.pool.Query(e.ctx, "EXPLAIN "+q, args...)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return strings.Join(lines, "\n")
	}
	page := explain(store.ReplayNextPage, tg.Generation, "00000000-0000-0000-0000-000000000000", int64(1)<<40)
	ids := make([]string, 1000)
	rows, err := e.pool.Query(e.ctx, "SELECT event_id::text FROM _ontology_replication_receipts LIMIT 1000")
	require.NoError(t, err)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	receipts := explain(store.ReplayReceipts, tg.Generation, ids)
	for table, plan := range map[string]string{"_ontology_replication_delivery": page, "_ontology_replication_receipts": receipts} {
		require.NotContains(t, plan, "Seq Scan on "+table, plan)
		require.Contains(t, plan, "Index Scan using "+table+"_pkey", plan)
		require.NotContains(t, plan, "Hash", plan)
	}
}

// TestEventReadsMatchTheSeed: the store's reads of a batch's events, given
// the ids as a uuid[], return the rows the seed's return for the same ids
// as a JSON array: duplicates, ids of other tables and unknown ids included.
func TestEventReadsMatchTheSeed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.products(t, 5)
	tg := e.start(t) // baselines of the five products
	e.products(t, 5)
	read := func(q string, list any) []string {
		rows, err := e.pool.Query(e.ctx, q, tg.Generation, list)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			var id string
			var event []byte
			err := r.Scan(&id, &event)
			return id + " " + string(event), err
		})
		require.NoError(t, err)
		slices.Sort(got)
		return got
	}
	ids := func(q string) []string {
		rows, err := e.pool.Query(e.ctx, q)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	baselines := ids("SELECT id::text FROM _ontology_replication_baselines ORDER BY id")
	history := ids("SELECT id::text FROM product_history WHERE replication IS NOT NULL ORDER BY id")
	require.Len(t, baselines, 5)
	require.Len(t, history, 5, "the products created after the start")
	list := slices.Concat(baselines[:3], history[:4], baselines[:1], history[:2], []string{"00000000-0000-4000-8000-000000000000"})
	raw, _ := json.Marshal(list)
	for i, table := range []string{"", `"public"."product_history"`} {
		seed, ours := store.SeedEventReads[i], store.EventReads[i]
		if table != "" {
			seed, ours = fmt.Sprintf(seed, table), fmt.Sprintf(ours, table)
		}
		want := read(seed, string(raw))
		require.Len(t, want, []int{3, 4}[i])
		require.Equal(t, want, read(ours, list))
	}
}
