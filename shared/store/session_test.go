package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// openSession opens a drain session on the active target, closed when the
// test ends.
func (e *env) openSession(t testing.TB, st *store.Store) *store.Session {
	t.Helper()
	state, _, ss, err := st.OpenSession(e.ctx)
	require.NoError(t, err)
	require.NotNil(t, ss, "state %+v", state)
	t.Cleanup(func() { ss.Close(context.Background()) })
	return ss
}

// next runs one round trip of a session, failing the test on an error.
func next(t testing.TB, ss *store.Session, claim bool, finish ...store.Finishing) (int64, store.State, *store.Claim) {
	t.Helper()
	n, state, c, err := ss.Next(context.Background(), finish, claim)
	require.NoError(t, err)
	return n, state, c
}

// acked finishes a claim with every event accepted.
func acked(c *store.Claim) store.Finishing {
	return store.Finishing{Claim: c, Accepted: c.IDs()}
}

// queueOrder returns the pending events' history ids in queue order.
func (e *env) queueOrder(t testing.TB) []string {
	t.Helper()
	rows, err := e.pool.Query(e.ctx, `SELECT event_id::text FROM _ontology_replication_delivery WHERE accepted_at IS NULL ORDER BY revision, event_id`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return ids
}

// claimVia claims the next batch of the active target one of the drain's
// two ways: "session" (a Session's first claim) or "own connection"
// (ClaimActive).
func (e *env) claimVia(ctx context.Context, t testing.TB, how string) *store.Claim {
	t.Helper()
	var c *store.Claim
	var err error
	if how == "session" {
		_, _, c, err = e.openSession(t, e.store).Next(ctx, nil, true)
	} else {
		_, _, c, err = e.store.ClaimActive(ctx)
	}
	require.NoError(t, err)
	return c
}

// TestSessionClaimsGoForwardAndNeverMeetTheirOwn: a session with claims out
// takes disjoint batches in queue order, past the events another drain
// holds; a claim made while others are out goes on after the last one,
// even once an earlier one is finished (a try-lock of its own lock would
// succeed: starting from the head it would take its own events again); once
// none is out the next claim starts from the head of the queue, where the
// events the other drain held are, released meanwhile.
func TestSessionClaimsGoForwardAndNeverMeetTheirOwn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.productsBulk(t, 450)
	queue := e.queueOrder(t)
	require.Len(t, queue, 450)
	other := e.claimOf(t, e.store, tg) // another drain: the head of the queue
	require.Equal(t, queue[:100], other.IDs())

	ss := e.openSession(t, e.store)
	_, _, a := next(t, ss, true)
	_, _, b := next(t, ss, true)
	require.Equal(t, queue[100:200], a.IDs(), "past the other drain's events")
	require.Equal(t, queue[200:300], b.IDs())
	require.Equal(t, 2, ss.Out())
	require.Len(t, e.claimHolders(t), 2, "the other drain's session and this one")

	n, _, c := next(t, ss, true, acked(a))
	require.EqualValues(t, 100, n)
	require.Equal(t, queue[300:400], c.IDs(), "after the last claim, though the first is finished")
	require.Equal(t, 2, ss.Out())

	other.Release(e.ctx)
	n, _, d := next(t, ss, true, acked(b), acked(c))
	require.EqualValues(t, 200, n)
	require.Equal(t, queue[:100], d.IDs(), "none out: from the head, where the released events are")
	_, _, last := next(t, ss, true, acked(d))
	require.Equal(t, queue[400:], last.IDs())
	require.False(t, last.More)
	_, _, none := next(t, ss, true, acked(last))
	require.Empty(t, none.Events)
	require.Zero(t, ss.Out())
	require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
	require.Empty(t, e.claimHolders(t), "every claim finished: no lock left")
	requireConsistent(t, e)
}

// TestClaimSkipsARowAnAcknowledgementHolds: an acknowledgement that has
// updated a pending row but not committed (here the seed's own, which
// honours no claim lock) holds the row; a claim neither waits for it nor
// takes it, on its own connection or in a session, and its snapshot, which
// still sees the row pending, does not make it publish the row again.
func TestClaimSkipsARowAnAcknowledgementHolds(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"own connection", "session"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, &sdkfixture.V4Template)
			tg := e.start(t)
			e.products(t, 5)
			queue := e.queueOrder(t)
			ack, err := e.pool.Begin(e.ctx)
			require.NoError(t, err)
			defer func() { _ = ack.Rollback(e.ctx) }()
			tag, err := ack.Exec(e.ctx, store.SeedStateUpdates[0], tg.Generation, `["`+queue[0]+`"]`)
			require.NoError(t, err)
			require.EqualValues(t, 1, tag.RowsAffected())

			// Well within the lock timeout: a claim that waited would fail.
			ctx, cancel := context.WithTimeout(e.ctx, 4*time.Second)
			defer cancel()
			c := e.claimVia(ctx, t, how)
			defer c.Release(e.ctx)
			require.Equal(t, queue[1:], c.IDs())
			require.NoError(t, ack.Commit(e.ctx))
			_, err = c.Finish(e.ctx, c.IDs(), nil)
			require.NoError(t, err)
			require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
			requireConsistent(t, e)
		})
	}
}

// TestClaimTakesRowsOthersTouchedAndLeft: a pending row whose version
// another transaction touched and left (a row lock it committed, an
// acknowledgement it rolled back) carries that transaction in its xmax; the
// claim's statement locks such rows to read them at their newest version,
// finds them still pending and takes them, on its own connection and in a
// session.
func TestClaimTakesRowsOthersTouchedAndLeft(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"own connection", "session"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, &sdkfixture.V4Template)
			tg := e.start(t)
			e.products(t, 5)
			queue := e.queueOrder(t)
			lock, err := e.pool.Begin(e.ctx)
			require.NoError(t, err)
			_, err = lock.Exec(e.ctx, `SELECT FROM _ontology_replication_delivery WHERE event_id = $1 FOR NO KEY UPDATE`, queue[1])
			require.NoError(t, err)
			require.NoError(t, lock.Commit(e.ctx))
			ack, err := e.pool.Begin(e.ctx)
			require.NoError(t, err)
			_, err = ack.Exec(e.ctx, store.SeedStateUpdates[0], tg.Generation, `["`+queue[3]+`"]`)
			require.NoError(t, err)
			require.NoError(t, ack.Rollback(e.ctx))
			require.EqualValues(t, 2, e.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL AND xmax <> '0'::xid`))

			c := e.claimVia(e.ctx, t, how)
			defer c.Release(e.ctx)
			require.Equal(t, queue, c.IDs())
			_, err = c.Finish(e.ctx, c.IDs(), nil)
			require.NoError(t, err)
			requireConsistent(t, e)
		})
	}
}

// TestSessionIdleGivesItsConnectionBack: between turns a session's
// connection goes back to the pool, so that other work takes it on a pool of
// one; the next round trip takes one again.
func TestSessionIdleGivesItsConnectionBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	e.products(t, 3)
	cfg := e.pool.Config().Copy()
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	require.NoError(t, err)
	closeBounded(t, pool)
	st, err := store.New(pool, store.Config{})
	require.NoError(t, err)
	ss := e.openSession(t, st)
	_, _, c := next(t, ss, true)
	require.Len(t, c.Events, 3)
	ss.Idle(e.ctx) // a claim is out: nothing happens
	_, _, _ = next(t, ss, false, acked(c))
	ss.Idle(e.ctx)
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err, "the pool's one connection is free")
	conn.Release()
	e.products(t, 2)
	_, _, c = next(t, ss, true)
	require.Len(t, c.Events, 2)
	_, _, _ = next(t, ss, false, acked(c))
}

// TestSessionCloseReleasesItsClaims: claims still out when a session closes
// are released, their events pending for the next drain, and cannot be
// finished any more.
func TestSessionCloseReleasesItsClaims(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 150)
	_, _, ss, err := e.store.OpenSession(e.ctx)
	require.NoError(t, err)
	_, _, a := next(t, ss, true)
	_, _, b := next(t, ss, true)
	require.Len(t, a.Events, 100)
	require.Len(t, b.Events, 50)
	ss.Close(e.ctx)
	require.Empty(t, e.claimHolders(t))
	_, err = a.Finish(e.ctx, a.IDs(), nil)
	require.Error(t, err, "the claim ended with its session")
	require.ElementsMatch(t, append(a.IDs(), b.IDs()...), e.drainAll(t, tg), "pending for the next drain")
}

// TestSessionStopsWhenReplicationPauses: paused, or another generation made
// active, a session claims nothing and holds no lock; the state says why.
func TestSessionStopsWhenReplicationPauses(t *testing.T) {
	t.Parallel()
	for _, change := range []string{"paused", "another generation"} {
		t.Run(change, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, &sdkfixture.V4Template)
			tg := e.start(t)
			e.products(t, 5)
			ss := e.openSession(t, e.store)
			require.NoError(t, sdkfixture.Pause(e.ctx, e.pool))
			if change == "another generation" {
				e.start(t)
			}
			_, state, c := next(t, ss, true)
			require.Nil(t, c)
			if change == "paused" {
				require.False(t, state.Enabled)
			} else {
				require.True(t, state.Enabled)
				require.NotEqual(t, tg.Generation, state.ActiveGeneration)
			}
			require.Empty(t, e.claimHolders(t))
		})
	}
}

// TestSessionReadsItsEventsAfterARename: a history table a session's
// claims read in their own statement is renamed under it (the capture
// function keeps its name): the next claim's statement names a table that
// is gone, fails before it runs, and is made again with the tables looked
// up again. (Events queued before the rename name the old table: the SDK's
// read fails on them, and a claim sets them aside as it does any event of
// a table without a capture trigger.)
func TestSessionReadsItsEventsAfterARename(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	_, err := e.w.Create(e.ctx, "customer", map[string]any{"name": "c"})
	require.NoError(t, err)
	ss := e.openSession(t, e.store)
	_, _, c := next(t, ss, true)
	_, _, _ = next(t, ss, false, acked(c))
	require.Equal(t, []string{"customer_history"}, store.ReadTables(e.store))
	e.exec(t, "ALTER TABLE customer_history RENAME TO client_history")
	e.products(t, 2)
	_, _, c = next(t, ss, true)
	require.Len(t, c.Events, 2)
	_, _, _ = next(t, ss, false, acked(c))
	require.Equal(t, []string{"product_history"}, store.ReadTables(e.store))
	requireConsistent(t, e)
}

// TestClaimReadsItsEventsAfterARename: the same for a claim on its own
// connection (the drain function's).
func TestClaimReadsItsEventsAfterARename(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	_, err := e.w.Create(e.ctx, "customer", map[string]any{"name": "c"})
	require.NoError(t, err)
	e.drainAll(t, tg)
	require.Equal(t, []string{"customer_history"}, store.ReadTables(e.store))
	e.exec(t, "ALTER TABLE customer_history RENAME TO client_history")
	e.products(t, 2)
	_, _, c, err := e.store.ClaimActive(e.ctx)
	require.NoError(t, err)
	defer c.Release(e.ctx)
	require.Len(t, c.Events, 2)
	_, err = c.Finish(e.ctx, c.IDs(), nil)
	require.NoError(t, err)
}

// TestClaimStatementLocksItsCandidates: the claim's statement locks for
// the statement the rows it claimed that another transaction touched
// (LockRows, SKIP LOCKED), and reads the events of the tables met before by
// primary key.
func TestClaimStatementLocksItsCandidates(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 3)
	rows, err := e.pool.Query(e.ctx, "EXPLAIN (VERBOSE) "+store.CandidatesReading(`"product_history"`), tg.Generation, store.ClaimLockClass,
		store.Backoffs(e.store), []string{"product_history"}, "60000ms", []int32{})
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := fmt.Sprint(lines)
	require.Contains(t, plan, "LockRows")
	require.Contains(t, plan, "Index Scan using product_history_pkey")
	require.NotContains(t, plan, "Seq Scan on product_history")
}

// TestSessionSetAsideBackoffDoubles: an event a session sets aside again
// and again waits twice as long each time (1, 2, 4 minutes by default), up
// to the cap, as one set aside by a claim of its own does.
func TestSessionSetAsideBackoffDoubles(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	e.products(t, 1)
	ss := e.openSession(t, e.store)
	for round, want := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute} {
		_, _, c := next(t, ss, true)
		require.NotNil(t, c)
		require.Len(t, c.Events, 1, "round %d: the event is claimable again", round)
		id := c.Events[0].HistoryID
		next(t, ss, false, store.Finishing{Claim: c, SetAside: []store.SetAside{{HistoryID: id, Reason: store.ReasonRejected}}})
		var interval time.Duration
		require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT next_verify_at - last_checked_at FROM _ontology_replication_delivery WHERE event_id = $1::uuid`, id).Scan(&interval))
		require.Equal(t, want, interval, "round %d", round)
		// Its backoff over: the interval kept, both times moved back.
		e.exec(t, `UPDATE _ontology_replication_delivery SET last_checked_at = last_checked_at - (next_verify_at - last_checked_at) - interval '1 second',
			next_verify_at = next_verify_at - (next_verify_at - last_checked_at) - interval '1 second' WHERE event_id = $1::uuid`, id)
	}
}
