package store_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// verifyAll verifies every accepted event, in rounds of DueUnverified.
func (e *env) verifyAll(t testing.TB, tg store.Target) int64 {
	t.Helper()
	var total int64
	for {
		e.exec(t, `UPDATE _ontology_replication_delivery SET next_verify_at = now() WHERE accepted_at IS NOT NULL AND verified_at IS NULL`)
		due, err := e.store.DueUnverified(e.ctx, tg)
		require.NoError(t, err)
		if len(due) == 0 {
			return total
		}
		ids := make([]string, len(due))
		for i, r := range due {
			ids[i] = r.HistoryID
		}
		n, err := e.store.VerifyEvents(e.ctx, tg, ids)
		require.NoError(t, err)
		total += n
	}
}

func TestUpgradeAndBackfillCarryReceipts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V3Template)
	e.products(t, 2) // baseline
	tg := e.start(t)
	e.productsBulk(t, 2500)
	order, err := e.w.Create(e.ctx, "order", map[string]any{"reference": "o"})
	require.NoError(t, err)
	require.NoError(t, e.w.Link(e.ctx, "order", "products", order, e.firstProduct(t)))

	// Deliver most of it under protocol 3 and verify part of that.
	for range 20 {
		c, err := e.store.Claim(e.ctx, tg)
		require.NoError(t, err)
		_, err = c.Acknowledge(e.ctx)
		require.NoError(t, err)
	}
	due, err := e.store.DueUnverified(e.ctx, tg)
	require.NoError(t, err)
	var ids []string
	for _, r := range due[:700] {
		ids = append(ids, r.HistoryID)
	}
	_, err = e.store.VerifyEvents(e.ctx, tg, ids)
	require.NoError(t, err)
	before, err := e.store.Status(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, store.Status{Total: 2504, Accepted: 2000, Verified: 700, Pending: 504, DueVerifications: 1300}, before)

	require.NoError(t, sdkfixture.Upgrade(e.ctx, e.pool, sdkfixture.Demo))
	tg = e.target(t)
	require.True(t, tg.UsesDelivery())
	require.False(t, tg.BackfillComplete)
	// Writes after the upgrade are queued by the capture trigger itself.
	e.products(t, 3)

	pages := map[string]int{}
	for {
		page, err := e.store.AdvanceBackfill(e.ctx, tg)
		require.NoError(t, err)
		pages[page.Table] += 1
		if page.Complete {
			break
		}
		require.Less(t, len(pages), 10)
	}
	require.Equal(t, map[string]int{"baselines": 1, "customer_history": 1, "product_history": 3, "order_history": 1}, pages,
		"product_history holds 2,500 backfill rows: three pages")
	again, err := e.store.AdvanceBackfill(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, store.BackfillPage{Complete: true}, again)

	after, err := e.store.Status(e.ctx, tg)
	require.NoError(t, err)
	require.EqualValues(t, before.Total+3, after.Total)
	require.Equal(t, before.Accepted, after.Accepted)
	require.Equal(t, before.Verified, after.Verified, "verified_count carries the verified receipts")
	require.EqualValues(t, 507, after.Pending)
	require.EqualValues(t, 700, e.count(t, "SELECT verified_count FROM _ontology_replication_targets"))
	require.EqualValues(t, 2507, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery"))
	require.Zero(t, e.count(t, `SELECT count(*) FROM _ontology_replication_delivery d LEFT JOIN _ontology_replication_receipts r USING (generation, event_id)
		WHERE (d.accepted_at IS NULL) <> (r.event_id IS NULL) OR d.accepted_at <> r.accepted_at OR d.verified_at IS DISTINCT FROM r.verified_at`),
		"delivery rows carry the receipts' state exactly")
	require.EqualValues(t, 2, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE is_baseline AND history_table IS NULL"))

	published := e.drainAll(t, tg)
	require.Len(t, published, 507)
	e.verifyAll(t, tg)
	ready, err := e.store.InitiallyReady(e.ctx, tg)
	require.NoError(t, err)
	require.True(t, ready)
}

func (e *env) firstProduct(t testing.TB) string {
	t.Helper()
	var id string
	require.NoError(t, e.pool.QueryRow(e.ctx, "SELECT id::text FROM product ORDER BY created_at, id LIMIT 1").Scan(&id))
	return id
}

func TestBackfillResumesAfterInterruption(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V3Template)
	tg := e.start(t)
	e.productsBulk(t, 1500)
	require.NoError(t, sdkfixture.Upgrade(e.ctx, e.pool, sdkfixture.Demo))
	tg = e.target(t)
	page, err := e.store.AdvanceBackfill(e.ctx, tg) // baselines
	require.NoError(t, err)
	require.False(t, page.Complete)
	page, err = e.store.AdvanceBackfill(e.ctx, tg) // customer_history
	require.NoError(t, err)
	page, err = e.store.AdvanceBackfill(e.ctx, tg) // product_history, first 1,000
	require.NoError(t, err)
	require.Equal(t, store.BackfillPage{Table: "product_history", Rows: 1000}, page)
	cursor := func() string {
		var c string
		require.NoError(t, e.pool.QueryRow(e.ctx, "SELECT backfill_cursor->>'id' FROM _ontology_replication_targets").Scan(&c))
		return c
	}
	var thousandth string
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT id::text FROM product_history WHERE replication IS NOT NULL
		ORDER BY id OFFSET 999 LIMIT 1`).Scan(&thousandth))
	require.Equal(t, thousandth, cursor())

	// A page that dies in the middle of its statement leaves nothing
	// behind: a transaction of the test's own inserts the delivery row of
	// the page's first event and holds it, the page's INSERT waits on it,
	// and the page's backend is terminated while it waits.
	blocker, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(e.ctx) }()
	_, err = blocker.Exec(e.ctx, `INSERT INTO _ontology_replication_delivery (generation, event_id, history_table, revision, is_baseline, next_verify_at)
		SELECT $1::uuid, id, 'product_history', (replication->>'revision')::bigint, false, now() FROM product_history
		WHERE replication IS NOT NULL ORDER BY id OFFSET 1000 LIMIT 1`, tg.Generation)
	require.NoError(t, err)
	died := make(chan error, 1)
	go func() {
		_, err := e.store.AdvanceBackfill(e.ctx, tg)
		died <- err
	}()
	var pid int32
	pollFor(t, "the backfill page to wait for a lock", func() bool {
		err := e.pool.QueryRow(e.ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE 'WITH page AS%'`).Scan(&pid)
		if err != nil {
			require.ErrorIs(t, err, pgx.ErrNoRows)
			return false
		}
		return true
	})
	_, err = e.pool.Exec(e.ctx, "SELECT pg_terminate_backend($1)", pid)
	require.NoError(t, err)
	require.Error(t, await.Receive(t, died, "died"))
	require.NoError(t, blocker.Rollback(e.ctx))
	require.EqualValues(t, 1000, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery"))
	require.Equal(t, thousandth, cursor(), "the cursor is where the last committed page left it")

	// A second store (a new job run) continues where the first stopped:
	// its first page is the remaining 500 rows, not the first 1,000 again.
	other, err := store.New(e.pool, store.Config{})
	require.NoError(t, err)
	page, err = other.AdvanceBackfill(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, store.BackfillPage{Table: "product_history", Rows: 500}, page)
	for !page.Complete {
		page, err = other.AdvanceBackfill(e.ctx, tg)
		require.NoError(t, err)
	}
	require.EqualValues(t, 1500, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery"))
}

func TestReplayResetsExactlyTheFencedRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.products(t, 3) // baseline
	tg := e.start(t)
	e.productsBulk(t, 2200)
	e.drainAll(t, tg)
	require.EqualValues(t, 2203, e.verifyAll(t, tg))
	require.EqualValues(t, 2203, e.count(t, "SELECT verified_count FROM _ontology_replication_targets"))

	require.NoError(t, e.store.InitReplay(e.ctx, tg))
	tg = e.target(t)
	require.False(t, tg.ReplayComplete)
	require.EqualValues(t, 2200, *tg.InitialRevision, "the fence is the revision sequence's value")
	ready, err := e.store.InitiallyReady(e.ctx, tg)
	require.NoError(t, err)
	require.False(t, ready)

	// Written after initialisation: delivered and verified, never reset.
	e.products(t, 5)
	e.drainAll(t, tg)
	require.EqualValues(t, 5, e.verifyAll(t, tg))

	var pages []store.ReplayPage
	for {
		page, err := e.store.AdvanceReplay(e.ctx, tg)
		require.NoError(t, err)
		pages = append(pages, page)
		if page.Complete {
			break
		}
	}
	require.Equal(t, []store.ReplayPage{{Rows: 1000, Verified: 1000}, {Rows: 1000, Verified: 1000}, {Rows: 203, Verified: 203, Complete: true}}, pages)
	require.EqualValues(t, 2203, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL AND verified_at IS NULL AND (is_baseline OR revision <= 2200)"))
	require.EqualValues(t, 5, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NOT NULL AND revision > 2200"))
	require.EqualValues(t, 5, e.count(t, "SELECT count(*) FROM _ontology_replication_receipts"), "only the later rows keep receipts")
	require.EqualValues(t, 5, e.count(t, "SELECT verified_count FROM _ontology_replication_targets"), "verified rows were subtracted")
	page, err := e.store.AdvanceReplay(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, store.ReplayPage{Complete: true}, page, "a finished replay does nothing")

	require.Len(t, e.drainAll(t, tg), 2203)
	e.verifyAll(t, tg)
	ready, err = e.store.InitiallyReady(e.ctx, tg)
	require.NoError(t, err)
	require.True(t, ready)
	status, err := e.store.Status(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, store.Status{Total: 2208, Accepted: 2208, Verified: 2208, InitiallyReady: true}, status)
}

func TestInitReplayUnknownGeneration(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	tg.Generation = "00000000-0000-4000-8000-000000000000"
	require.ErrorIs(t, e.store.InitReplay(e.ctx, tg), store.ErrUnknownGeneration)
}

// TestLifecycleHoldIsVisible: a session holding the SDK's lifecycle lock
// exclusively (as any role may: advisory locks need no privilege) is seen,
// with the writers waiting behind it and how long the first has waited.
func TestLifecycleHoldIsVisible(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	hold, err := e.store.LifecycleHold(e.ctx)
	require.NoError(t, err)
	require.Nil(t, hold, "nobody holds it")

	holder, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(e.ctx) }()
	_, err = holder.Exec(e.ctx, `SELECT set_config('application_name', 'someone', true), pg_advisory_xact_lock(hashtextextended($1, 0))`, store.LifecycleLock)
	require.NoError(t, err)
	written := make(chan error, 1)
	go func() { _, err := e.w.Create(e.ctx, "product", map[string]any{"title": "waits"}); written <- err }()
	pollFor(t, "an SDK writer to wait for the held lifecycle lock", func() bool {
		hold, err = e.store.LifecycleHold(e.ctx)
		require.NoError(t, err)
		return hold != nil && hold.Waiting > 0
	})
	require.Len(t, hold.Holders, 1)
	require.Equal(t, "someone", hold.Holders[0].Application)
	require.Equal(t, 1, hold.Waiting, "the SDK writer waits")
	require.NoError(t, holder.Rollback(e.ctx))
	require.NoError(t, await.Receive(t, written, "written"))
}
