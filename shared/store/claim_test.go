package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// claimOf claims a batch and releases it when the test ends, so that a
// failing test never leaves a session out of its pool.
func (e *env) claimOf(t testing.TB, st *store.Store, tg store.Target) *store.Claim {
	t.Helper()
	c, err := st.Claim(e.ctx, tg)
	require.NoError(t, err)
	t.Cleanup(func() { c.Release(context.Background()) })
	return c
}

// claimHolders returns the backends that hold claim locks.
func (e *env) claimHolders(t testing.TB) []int32 {
	t.Helper()
	rows, err := e.pool.Query(e.ctx, `SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
		AND classid::int = hashtext($1) AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, store.ClaimLockClass)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	return pids
}

// TestClaimsHoldNoLockTheSDKWaitsOn: while a claimed batch is out (its
// publish in flight), the SDK's pause and replay start, which take the
// lifecycle lock exclusively, and an SDK writer, which takes it shared, all
// go through at once; the claim is then acknowledged, and every event ends
// accepted once.
func TestClaimsHoldNoLockTheSDKWaitsOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 20)
	c := e.claimOf(t, e.store, tg)
	require.Len(t, c.Events, 20)
	require.Len(t, e.claimHolders(t), 1)
	require.Zero(t, e.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`),
		"the claim's session holds no transaction open")

	// Each must finish well within the SDK's 5 s lock timeout.
	quick, cancel := context.WithTimeout(e.ctx, 2*time.Second)
	defer cancel()
	require.NoError(t, e.store.InitReplay(quick, tg), "replay start")
	_, err := e.w.Create(quick, "product", map[string]any{"title": "written while the claim is out"})
	require.NoError(t, err, "SDK writer")
	require.NoError(t, e.exec2(quick, "ALTER TABLE _ontology_replication_delivery ADD COLUMN IF NOT EXISTS migration_probe int"),
		"a migration's ACCESS EXCLUSIVE lock on the delivery table")
	require.NoError(t, sdkfixture.Pause(quick, e.pool), "SDK pause")

	n, err := c.Acknowledge(e.ctx)
	require.NoError(t, err, "the acknowledgement after the publish")
	require.EqualValues(t, 20, n)
	require.Empty(t, e.claimHolders(t), "acknowledged: the claim's locks are gone")
	requireConsistent(t, e)
}

func (e *env) exec2(ctx context.Context, query string) error {
	_, err := e.pool.Exec(ctx, query)
	return err
}

// TestAcceptedAtIsTheAcknowledgementTime: accepted_at, next_verify_at and
// the receipt's accepted_at are the time the acknowledgement ran, after the
// publish, not the time of the claim.
func TestAcceptedAtIsTheAcknowledgementTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 5)
	c := e.claimOf(t, e.store, tg)
	var claimedAt time.Time
	require.NoError(t, e.pool.QueryRow(e.ctx, "SELECT now()").Scan(&claimedAt))
	// The publish: the server's clock moves on before the acknowledgement.
	require.NoError(t, e.exec2(e.ctx, "SELECT pg_sleep(0.2)"))
	var published time.Time
	require.NoError(t, e.pool.QueryRow(e.ctx, "SELECT clock_timestamp()").Scan(&published))
	_, err := c.Acknowledge(e.ctx)
	require.NoError(t, err)
	require.Zero(t, e.count(t, `SELECT count(*) FROM _ontology_replication_delivery d JOIN _ontology_replication_receipts r USING (generation, event_id)
		WHERE d.accepted_at < $1 OR d.next_verify_at <> d.accepted_at OR r.accepted_at <> d.accepted_at`, published))
	require.EqualValues(t, 5, e.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at >= $1`, claimedAt.Add(200*time.Millisecond)))
}

// TestReplayPageRemovesReceiptsOfAcknowledgementsItWaitedFor: an
// acknowledgement holds a row the replay page wants; the page waits, the
// acknowledgement commits its receipt, and the page resets the row and
// removes that receipt too, so no receipt is left on a pending row.
func TestReplayPageRemovesReceiptsOfAcknowledgementsItWaitedFor(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	ids := e.products(t, 3)
	b, err := e.store.PendingEvents(e.ctx, tg)
	require.NoError(t, err)
	_, err = e.store.Acknowledge(e.ctx, tg, b.IDs()[:2]) // two accepted, one pending
	require.NoError(t, err)
	require.NoError(t, e.store.InitReplay(e.ctx, tg))

	// An acknowledgement of the pending row, held open after its update.
	ack, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = ack.Rollback(e.ctx) }()
	_, err = ack.Exec(e.ctx, "SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))", store.LifecycleLock)
	require.NoError(t, err)
	tag, err := ack.Exec(e.ctx, store.StateUpdates[0], tg.Generation, []string{b.IDs()[2]})
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())

	page := make(chan error, 1)
	go func() {
		_, err := e.store.AdvanceReplay(e.ctx, tg)
		page <- err
	}()
	// The page is waiting for the row the acknowledgement holds.
	require.Eventually(t, func() bool {
		return e.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%replay_cursor%'`) == 1
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, ack.Commit(e.ctx))
	require.NoError(t, await.Receive(t, page, "page"))

	require.EqualValues(t, len(ids), e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"), "every row reset")
	require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_receipts"), "no receipt left on a pending row")
	requireConsistent(t, e)
}

// TestDeadDrainsClaimIsTakenOver: a drain that dies mid-publish (its
// session ends) leaves its events to the next claim at once; one whose
// process froze with its session open (nothing touches it: this claim has
// no keepalive) loses them after IdleTimeout.
func TestDeadDrainsClaimIsTakenOver(t *testing.T) {
	t.Parallel()
	t.Run("session ends", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, &sdkfixture.V4Template)
		tg := e.start(t)
		e.products(t, 10)
		dying := e.claimOf(t, e.store, tg)
		require.Len(t, dying.Events, 10)
		holders := e.claimHolders(t)
		require.Len(t, holders, 1)
		e.exec(t, "SELECT pg_terminate_backend($1)", holders[0])
		require.Eventually(t, func() bool { return len(e.claimHolders(t)) == 0 }, 10*time.Second, 5*time.Millisecond)
		next := e.claimOf(t, e.store, tg)
		require.ElementsMatch(t, dying.IDs(), next.IDs(), "taken over as soon as the session is gone")
		_, err := next.Acknowledge(e.ctx)
		require.NoError(t, err)
		_, err = dying.Acknowledge(e.ctx)
		require.Error(t, err, "the dead drain's acknowledgement fails: nothing is acknowledged twice")
		requireConsistent(t, e)
	})
	t.Run("session hangs", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, &sdkfixture.V4Template)
		tg := e.start(t)
		e.products(t, 10)
		hanging, err := store.New(e.pool, store.Config{IdleTimeout: time.Second})
		require.NoError(t, err)
		stuck := e.claimOf(t, hanging, tg)
		require.Len(t, stuck.Events, 10)
		other := e.claimOf(t, e.store, tg)
		require.Empty(t, other.Events, "held while the session is alive")
		// The server ends the idle session after a second.
		require.Eventually(t, func() bool { return len(e.claimHolders(t)) == 0 }, 20*time.Second, 10*time.Millisecond)
		next := e.claimOf(t, e.store, tg)
		require.ElementsMatch(t, stuck.IDs(), next.IDs())
	})
}

// TestConcurrentClaimsSkipEachOther: with several claims out at once, each
// takes events the others hold not, reading past them and counting them
// (Held), and the union is the queue; one more claim takes nothing and
// counts every event as held.
func TestConcurrentClaimsSkipEachOther(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.productsBulk(t, 450)
	seen := map[string]bool{}
	var claims []*store.Claim
	for range 5 {
		c := e.claimOf(t, e.store, tg)
		claims = append(claims, c)
		for _, id := range c.IDs() {
			require.False(t, seen[id], "claimed twice")
			seen[id] = true
		}
	}
	require.Len(t, seen, 450)
	require.Len(t, claims[4].Events, 50)
	require.False(t, claims[4].More)
	require.True(t, claims[0].More)
	for i, c := range claims {
		require.Equal(t, 100*i, c.Held, "claim %d read past the events of the %d before it", i, i)
	}
	none := e.claimOf(t, e.store, tg)
	require.Empty(t, none.Events)
	require.Equal(t, 450, none.Held, "a claim that took nothing counts what the others hold")
	none.Release(e.ctx)
	for _, c := range claims {
		_, err := c.Acknowledge(e.ctx)
		require.NoError(t, err)
	}
	require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
	requireConsistent(t, e)
}

// TestSessionsGoBackToThePoolWithoutClaims: after Finish, Release, an empty
// claim and a failed acknowledgement, no session of the pool holds a claim
// lock.
func TestSessionsGoBackToThePoolWithoutClaims(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 250)
	a := e.claimOf(t, e.store, tg)
	a.Release(e.ctx)
	b := e.claimOf(t, e.store, tg)
	_, err := b.Finish(e.ctx, b.IDs()[:10], nil)
	require.NoError(t, err)
	bad := e.claimOf(t, e.store, tg)
	_, err = bad.Finish(e.ctx, []string{"not-a-uuid"}, nil)
	require.Error(t, err)
	require.Empty(t, e.claimHolders(t))
	// Every session of the pool is idle and holds no advisory lock.
	var conns []*pgxpool.Conn
	for range int(e.pool.Stat().MaxConns()) {
		c, err := e.pool.Acquire(e.ctx)
		require.NoError(t, err)
		conns = append(conns, c)
		var locks int
		require.NoError(t, c.QueryRow(e.ctx, "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'").Scan(&locks))
		require.Zero(t, locks)
	}
	for _, c := range conns {
		c.Release()
	}
}

// TestRenamedHistoryTable: an entity's history table renamed under a
// running Store (the capture function keeps its name): the next backfill
// page and the next legacy read look the table up again and succeed.
func TestRenamedHistoryTable(t *testing.T) {
	t.Parallel()
	t.Run("backfill", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, &sdkfixture.V3Template)
		tg := e.start(t)
		e.productsBulk(t, 1500)
		require.NoError(t, sdkfixture.Upgrade(e.ctx, e.pool, sdkfixture.Demo))
		tg = e.target(t)
		var pages []store.BackfillPage
		for range 3 { // baselines, customers, the first page of products
			page, err := e.store.AdvanceBackfill(e.ctx, tg)
			require.NoError(t, err)
			pages = append(pages, page)
		}
		require.Equal(t, "product_history", pages[2].Table)
		e.exec(t, "ALTER TABLE product_history RENAME TO item_history")
		page, err := e.store.AdvanceBackfill(e.ctx, tg)
		require.NoError(t, err)
		require.Equal(t, store.BackfillPage{Table: "item_history", Rows: 500}, page)
	})
	t.Run("legacy read", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, &sdkfixture.V3Template)
		tg := e.start(t)
		e.products(t, 3)
		b, err := e.store.PendingEvents(e.ctx, tg)
		require.NoError(t, err)
		require.Len(t, b.Events, 3)
		e.exec(t, "ALTER TABLE product_history RENAME TO item_history")
		b, err = e.store.PendingEvents(e.ctx, tg)
		require.NoError(t, err)
		require.Len(t, b.Events, 3)
		c, err := e.store.Claim(e.ctx, tg)
		require.NoError(t, err)
		require.Len(t, c.Events, 3)
	})
}

// TestSetAsideIsReadAsTheSeedReadsIt: a set-aside event is still pending to
// every seed statement (the SDK's read returns it, its status counts it);
// only claims skip it, until its backoff has
// passed, when the next claim takes it with its backoff, and the next
// set-aside doubles it. The seed's own 30-second recheck of a requeued
// event is not mistaken for a set-aside.
func TestSetAsideIsReadAsTheSeedReadsIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 3)
	c := e.claimOf(t, e.store, tg)
	ids := c.IDs()
	bad := c.Events[0]
	_, err := c.Finish(e.ctx, c.IDs()[1:], []store.SetAside{{HistoryID: bad.HistoryID, EventID: bad.EventID, Reason: store.ReasonRejected}})
	require.NoError(t, err)

	sdk, err := e.store.PendingEvents(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, []string{bad.HistoryID}, sdk.IDs(), "the SDK's read")
	sdkStatus, err := e.store.Status(e.ctx, tg)
	require.NoError(t, err)
	require.EqualValues(t, 1, sdkStatus.Total-sdkStatus.Accepted, "the SDK's status")
	skip := e.claimOf(t, e.store, tg)
	require.Empty(t, skip.Events)

	// The backoff passes: the next claim takes it, knowing its backoff.
	e.exec(t, `UPDATE _ontology_replication_delivery SET next_verify_at = next_verify_at - interval '1 minute',
		last_checked_at = last_checked_at - interval '1 minute' WHERE event_id = $1::uuid`, bad.HistoryID)
	again := e.claimOf(t, e.store, tg)
	require.Equal(t, []string{bad.HistoryID}, again.IDs())
	require.Equal(t, time.Minute, again.Events[0].Backoff)
	_, err = again.Finish(e.ctx, nil, []store.SetAside{{HistoryID: bad.HistoryID, Reason: store.ReasonRejected}})
	require.NoError(t, err)
	require.EqualValues(t, 1, e.count(t, `SELECT count(*) FROM _ontology_replication_delivery
		WHERE event_id = $1::uuid AND next_verify_at = last_checked_at + interval '2 minutes'`, bad.HistoryID), "doubled")

	// A requeued event (the seed's retry: next check 30 s after the last)
	// is claimable at once.
	e.exec(t, `UPDATE _ontology_replication_delivery SET accepted_at = NULL, last_checked_at = now(),
		next_verify_at = now() + interval '30 seconds' WHERE event_id = $1::uuid`, ids[1])
	requeued := e.claimOf(t, e.store, tg)
	require.Contains(t, requeued.IDs(), ids[1])
	require.Zero(t, requeued.Events[0].Backoff)
}

// TestClaimsFromManySessions: claims from a second pool (another instance)
// skip what the first holds.
func TestClaimsFromManySessions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 150)
	otherPool, err := pgxpool.New(e.ctx, e.pool.Config().ConnString())
	require.NoError(t, err)
	t.Cleanup(otherPool.Close)
	other, err := store.New(otherPool, store.Config{})
	require.NoError(t, err)
	var wg sync.WaitGroup
	var a, b *store.Claim
	wg.Go(func() { a = e.claimOf(t, e.store, tg) })
	wg.Go(func() { b = e.claimOf(t, other, tg) })
	wg.Wait()
	require.Equal(t, 150, len(a.Events)+len(b.Events))
	for _, id := range a.IDs() {
		require.NotContains(t, b.IDs(), id)
	}
}

// TestFirstClaimOnALegacyDatabaseNeedsOneConnection: a fresh Store (which
// tries protocol 4 first) claims on a protocol-3 database through a pool of
// one connection: the claim does not hold its session while it reads the
// state on another. (It did: N concurrent drains through a pool of N each
// held one and waited for a second, and `job drain` on such a database hung
// until its deadline.)
func TestFirstClaimOnALegacyDatabaseNeedsOneConnection(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V3Template)
	e.start(t)
	e.products(t, 3)
	cfg := e.pool.Config().Copy()
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	require.NoError(t, err)
	closeBounded(t, pool)
	st, err := store.New(pool, store.Config{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	_, _, c, err := st.ClaimActive(ctx)
	require.NoError(t, err)
	require.Len(t, c.Events, 3)
	c.Release(ctx)

	// Upgraded under the running Store, which read it as legacy last time.
	require.NoError(t, sdkfixture.Upgrade(e.ctx, e.pool, sdkfixture.Demo))
	e.products(t, 2)
	_, tg, c, err := st.ClaimActive(ctx)
	require.NoError(t, err)
	require.True(t, tg.UsesDelivery())
	require.Len(t, c.Events, 2)
	c.Release(ctx)
}

func TestClaimAndRelease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 150)
	first, err := e.store.Claim(e.ctx, tg)
	require.NoError(t, err)
	require.Len(t, first.Events, 100)
	second, err := e.store.Claim(e.ctx, tg)
	require.NoError(t, err)
	require.Len(t, second.Events, 50, "a concurrent claim skips the locked rows")
	for _, id := range second.IDs() {
		require.NotContains(t, first.IDs(), id)
	}
	// The SDK's unlocked read sees the same first 100 whatever is claimed.
	unlocked, err := e.store.PendingEvents(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, first.IDs(), unlocked.IDs())

	second.Release(e.ctx)
	second.Release(e.ctx) // idempotent
	_, err = first.Acknowledge(e.ctx)
	require.NoError(t, err)
	rest := e.drainAll(t, tg)
	require.ElementsMatch(t, second.IDs(), rest, "released events are claimed again")
	require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}
