package store_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// takeTurn takes a turn of st and ends it when the test ends.
func (e *env) takeTurn(t testing.TB, st *store.Store) *store.Turn {
	t.Helper()
	turn, err := st.TakeTurn(e.ctx, time.Minute)
	require.NoError(t, err)
	t.Cleanup(func() { turn.End(e.ctx) })
	return turn
}

// TestTurnsCoalesceWakeUps: of the wake-ups of a workspace, whichever
// process they reach, one holds the turn, one the next turn, and the
// others are coalesced; the one next waits for the turn in its claim, and
// holds the next turn until the first has finished its claim, and its
// claim takes every event committed before the coalesced wake-ups,
// including one committed after the first drain's last claim (the lost
// wake-up).
func TestTurnsCoalesceWakeUps(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	other := otherProcess(t, e)

	e.products(t, 1)
	first := e.takeTurn(t, e.store)
	require.Equal(t, store.TurnTaken, first.Role())
	require.True(t, first.HoldsNext(), "a free turn is taken with the next turn")
	before := e.takeTurn(t, other)
	require.Equal(t, store.TurnCoalesced, before.Role(), "until its claim, the drain takes the events of later wake-ups")
	_, _, c, err := first.Claim(e.ctx)
	require.NoError(t, err)
	require.Len(t, c.Events, 1, "the drain's claim; its batch is out")

	// Committed after that claim, while the batch is published: the
	// commit's wake-up reaches another process.
	e.products(t, 1)
	next := e.takeTurn(t, other)
	require.Equal(t, store.TurnNext, next.Role(), "the turn is held: the wake-up is next")
	// Two more commits; their wake-ups are coalesced, on either process.
	e.products(t, 2)
	for _, st := range []*store.Store{e.store, other} {
		coalesced := e.takeTurn(t, st)
		require.Equal(t, store.TurnCoalesced, coalesced.Role())
	}

	claimed := make(chan *store.Claim, 1)
	go func() {
		_, _, c, err := next.Claim(e.ctx)
		assert.NoError(t, err)
		claimed <- c
	}()
	require.EqualValues(t, 1, awaitTurnWait(t, e), "its claim waits for the turn")
	require.Equal(t, store.TurnCoalesced, e.takeTurn(t, e.store).Role(), "it holds the next turn while it waits")
	_, err = c.Acknowledge(e.ctx) // the first drain's turn ends with its claim
	require.NoError(t, err)
	c = await.Receive(t, claimed, "the waiting drain's claim")
	require.NotNil(t, c)
	require.Len(t, c.Events, 3, "the waiting drain's claim takes every event its coalesced wake-ups left it")
	require.Positive(t, next.Waited(), "measured by the server")
	later := e.takeTurn(t, e.store)
	require.Equal(t, store.TurnNext, later.Role(), "claimed: the next turn is free")
	later.End(e.ctx)
	_, err = c.Acknowledge(e.ctx)
	require.NoError(t, err)
	require.Empty(t, e.claimHolders(t))
	free := e.takeTurn(t, other)
	require.Equal(t, store.TurnTaken, free.Role(), "the acknowledgement ended the turn")
}

// TestNoWakeUpIsLost: a commit that lands after the running drain's last
// claim found nothing, and before that drain lets its turn go, is taken by
// the wake-up that follows it: that wake-up waits for the turn (it is not
// coalesced into a drain that will not claim again) and claims it.
func TestNoWakeUpIsLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	other := otherProcess(t, e)
	var next *store.Turn
	store.BeforeRelease(e.store, func() {
		store.BeforeRelease(e.store, nil)
		e.products(t, 1)
		var err error
		next, err = other.TakeTurn(e.ctx, 10*time.Second)
		require.NoError(t, err)
	})
	first := e.takeTurn(t, e.store)
	require.Equal(t, store.TurnTaken, first.Role())
	_, _, c, err := first.Claim(e.ctx)
	require.NoError(t, err)
	require.Empty(t, c.Events, "the drain's last claim found nothing")
	require.NotNil(t, next, "the commit landed before the empty claim released its turn")
	t.Cleanup(func() { next.End(e.ctx) })
	require.Equal(t, store.TurnNext, next.Role(), "the wake-up after the commit is next, not coalesced")
	_, _, c, err = next.Claim(e.ctx)
	require.NoError(t, err)
	require.Len(t, c.Events, 1, "and its claim publishes the commit")
	_, err = c.Acknowledge(e.ctx)
	require.NoError(t, err)
}

// TestTurnWaitIsBounded: a drain that holds the turn past the wait's bound
// makes the claim of the one next give up with ErrTurnWait, and its next
// turn is free again.
func TestTurnWaitIsBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	e.products(t, 1)
	held := e.takeTurn(t, e.store)
	require.Equal(t, store.TurnTaken, held.Role())
	_, _, c, err := held.Claim(e.ctx) // its batch is out, for longer than the bound
	require.NoError(t, err)
	t.Cleanup(func() { c.Release(e.ctx) })
	require.Len(t, c.Events, 1)
	next, err := e.store.TakeTurn(e.ctx, 100*time.Millisecond)
	require.NoError(t, err)
	t.Cleanup(func() { next.End(e.ctx) })
	require.Equal(t, store.TurnNext, next.Role())
	_, _, _, err = next.Claim(e.ctx)
	require.ErrorIs(t, err, store.ErrTurnWait)
	again := e.takeTurn(t, e.store)
	require.Equal(t, store.TurnNext, again.Role(), "the one that gave up let the next turn go")
}

// TestTakingATurnIsOneStatement: a coalesced wake-up costs the database
// one statement in one round trip, and leaves no lock behind.
func TestTakingATurnIsOneStatement(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	held := e.takeTurn(t, e.store)
	require.True(t, held.HoldsNext())
	tracer := &statementCounter{}
	st := tracedStore(t, e, tracer)
	coalesced := e.takeTurn(t, st)
	require.Equal(t, store.TurnCoalesced, coalesced.Role())
	require.EqualValues(t, 1, tracer.statements.Load())
	require.EqualValues(t, 2, turnLocksHeld(t, e), "the turn and the next turn, both the first drain's; nothing of the coalesced one")
	held.End(e.ctx)
}

// turnLocksHeld counts the locks of the drain's turns held in e's
// database.
func turnLocksHeld(t testing.TB, e *env) int64 {
	t.Helper()
	return e.count(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid::int = hashtext($1) AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, store.DrainTurnClass)
}

// statementCounter counts the statements a connection sends (a pipeline's
// each).
type statementCounter struct{ statements atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.statements.Add(1)
	return ctx
}
func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (c *statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.statements.Add(1)
}
func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// tracedStore is a Store over a pool of its own whose statements tracer
// counts.
func tracedStore(t testing.TB, e *env, tracer pgx.QueryTracer) *store.Store {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(e.pool.Config().ConnString())
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	require.NoError(t, err)
	closeBounded(t, pool)
	st, err := store.New(pool, store.Config{})
	require.NoError(t, err)
	return st
}

// awaitTurnWait waits until a session of e's database waits in the server
// for a lock of the drain's turns, and returns which: 1 the turn, 2 the
// next turn.
func awaitTurnWait(t testing.TB, e *env) int64 {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		require.True(t, time.Now().Before(deadline), "no session waits for a turn")
		var key int64
		err := e.pool.QueryRow(e.ctx, `SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid::int = hashtext($1)
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) LIMIT 1`, store.DrainTurnClass).Scan(&key)
		if err == nil {
			return key
		}
		require.ErrorIs(t, err, pgx.ErrNoRows)
		time.Sleep(5 * time.Millisecond) // polling the server's lock table: the signal itself
	}
}

// TestQueuedTurnWaitsForTheDrainsAhead: a drain that must claim
// (QueueTurn), while one drain holds the turn and another the next turn,
// waits in the server for the next turn, in its one statement, and returns
// holding it; its claim then waits for the turn and takes every event
// committed before it was queued. Past its bound it gives up with
// ErrTurnWait and leaves no lock behind.
func TestQueuedTurnWaitsForTheDrainsAhead(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	other := otherProcess(t, e)
	e.products(t, 1)
	first := e.takeTurn(t, e.store)
	_, _, c, err := first.Claim(e.ctx)
	require.NoError(t, err)
	require.Len(t, c.Events, 1, "the first drain's batch is out")
	e.products(t, 2)
	next := e.takeTurn(t, other)
	require.Equal(t, store.TurnNext, next.Role())

	tracer := &statementCounter{}
	traced := tracedStore(t, e, tracer)
	_, err = traced.QueueTurn(e.ctx, 100*time.Millisecond)
	require.ErrorIs(t, err, store.ErrTurnWait, "the next turn held past the bound")
	require.EqualValues(t, 2, turnLocksHeld(t, e), "the turn and the next turn, the first's and the next's; nothing of the one that gave up")

	tracer.statements.Store(0)
	queued := make(chan *store.Turn, 1)
	var turn *store.Turn
	t.Cleanup(func() {
		if turn == nil {
			select {
			case turn = <-queued:
			case <-time.After(30 * time.Second):
				t.Error("the queued drain never returned")
			}
		}
		if turn != nil {
			turn.End(e.ctx)
		}
	})
	go func() {
		turn, err := traced.QueueTurn(e.ctx, 10*time.Second)
		assert.NoError(t, err)
		queued <- turn
	}()
	require.EqualValues(t, 2, awaitTurnWait(t, e), "it waits for the next turn")
	nextClaimed := make(chan *store.Claim, 1)
	go func() {
		_, _, nc, err := next.Claim(e.ctx) // it waits for the turn, then lets the next turn go
		assert.NoError(t, err)
		nextClaimed <- nc
	}()
	_, err = c.Acknowledge(e.ctx) // the first drain's turn ends
	require.NoError(t, err)
	nc := await.Receive(t, nextClaimed, "the next drain's claim")
	require.NotNil(t, nc)
	require.Len(t, nc.Events, 2)
	select {
	case turn = <-queued:
	case <-time.After(time.Minute):
		t.Fatal("the queued drain did not get the next turn")
	}
	require.NotNil(t, turn)
	require.Equal(t, store.TurnNext, turn.Role(), "the turn is the next drain's, whose batch is out")
	require.True(t, turn.HoldsNext())
	require.True(t, turn.Queued())
	require.Positive(t, turn.Waited(), "it waited for the next turn")
	require.EqualValues(t, 1, tracer.statements.Load(), "one statement, which bounds its own wait")
	e.products(t, 1) // committed while it holds the next turn: its claim takes it

	queuedClaimed := make(chan *store.Claim, 1)
	go func() {
		_, _, qc, err := turn.Claim(e.ctx)
		assert.NoError(t, err)
		queuedClaimed <- qc
	}()
	require.EqualValues(t, 1, awaitTurnWait(t, e), "its claim waits for the turn")
	_, err = nc.Acknowledge(e.ctx)
	require.NoError(t, err)
	qc := await.Receive(t, queuedClaimed, "the queued drain's claim")
	require.NotNil(t, qc)
	require.Len(t, qc.Events, 1, "the commit made while it held the next turn")
	_, err = qc.Acknowledge(e.ctx)
	require.NoError(t, err)
}

// TestClaimTellsALifecycleWaitFromATurnWait: a claim that takes the turn
// and then finds the lifecycle lock held (a migration) past the store's
// lock timeout fails with the lock timeout, not ErrTurnWait, and leaves
// no lock of the turns behind.
func TestClaimTellsALifecycleWaitFromATurnWait(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	e.products(t, 1)
	cfg, err := pgxpool.ParseConfig(e.pool.Config().ConnString())
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	require.NoError(t, err)
	closeBounded(t, pool)
	st, err := store.New(pool, store.Config{LockTimeout: 100 * time.Millisecond})
	require.NoError(t, err)

	first := e.takeTurn(t, e.store)
	_, _, c, err := first.Claim(e.ctx)
	require.NoError(t, err)
	require.Len(t, c.Events, 1, "the first drain's batch is out")
	turn, err := st.TakeTurn(e.ctx, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { turn.End(e.ctx) })
	require.Equal(t, store.TurnNext, turn.Role(), "its claim takes the turn")
	c.Release(e.ctx) // the turn is free again

	migration, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = migration.Rollback(e.ctx) })
	_, err = migration.Exec(e.ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, store.LifecycleLock)
	require.NoError(t, err)
	_, _, _, err = turn.Claim(e.ctx)
	require.Error(t, err)
	require.NotErrorIs(t, err, store.ErrTurnWait, "the claim took the turn: the lifecycle lock timed out")
	require.NoError(t, migration.Rollback(e.ctx))

	next, err := st.TakeTurn(e.ctx, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { next.End(e.ctx) })
	require.Equal(t, store.TurnTaken, next.Role(), "the failed claim let both turns go")
}

// TestNoDrainClaimsAheadOfTheNext: while the drain that is next gathers
// commits with the turn free (its claim takes the turn), a wake-up takes
// neither turn and a queued drain waits for the next turn: none claims
// ahead of it.
func TestNoDrainClaimsAheadOfTheNext(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	other := otherProcess(t, e)
	e.products(t, 1)
	first := e.takeTurn(t, e.store)
	_, _, c, err := first.Claim(e.ctx)
	require.NoError(t, err)
	next := e.takeTurn(t, other)
	require.Equal(t, store.TurnNext, next.Role())
	_, err = c.Acknowledge(e.ctx) // the turn is free; the next turn is held
	require.NoError(t, err)

	require.Equal(t, store.TurnCoalesced, e.takeTurn(t, e.store).Role())
	require.EqualValues(t, 1, turnLocksHeld(t, e), "the coalesced wake-up took nothing: the next turn only is held")
	queued, err := e.store.QueueTurn(e.ctx, 100*time.Millisecond)
	if queued != nil {
		queued.End(e.ctx)
	}
	require.ErrorIs(t, err, store.ErrTurnWait, "a queued drain waits for the next turn, not for the free turn")
	require.EqualValues(t, 1, turnLocksHeld(t, e))
	_, _, nc, err := next.Claim(e.ctx)
	require.NoError(t, err)
	require.Empty(t, nc.Events)
}
