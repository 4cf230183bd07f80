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
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// takeTurn takes a turn of st and ends it when the test ends.
func (e *env) takeTurn(t testing.TB, st *store.Store) *store.Turn {
	t.Helper()
	turn, err := st.TakeTurn(e.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { turn.End(e.ctx) })
	return turn
}

// TestTurnsCoalesceWakeUps: of the wake-ups of a workspace, whichever
// process they reach, one holds the turn, one waits for it, and the others
// are coalesced; the one waiting holds the turn once the first has
// finished its claim, and its claim takes every event committed before the
// coalesced wake-ups, including one committed after the first drain's last
// claim (the lost wake-up).
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
	require.Equal(t, store.TurnNext, next.Role(), "the turn is held: the wake-up waits for it")
	// Two more commits; their wake-ups are coalesced, on either process.
	e.products(t, 2)
	for _, st := range []*store.Store{e.store, other} {
		coalesced := e.takeTurn(t, st)
		require.Equal(t, store.TurnCoalesced, coalesced.Role())
	}

	waited := make(chan error, 1)
	go func() { waited <- next.Wait(e.ctx, 10*time.Second) }()
	waitUntilBlocked(t, e, "pg_advisory_lock")
	_, err = c.Acknowledge(e.ctx) // the first drain's turn ends with its claim
	require.NoError(t, err)
	require.NoError(t, <-waited)
	// It holds the turn and, until its claim, the next turn.
	require.Equal(t, store.TurnCoalesced, e.takeTurn(t, e.store).Role())

	_, _, c, err = next.Claim(e.ctx)
	require.NoError(t, err)
	require.Len(t, c.Events, 3, "the waiting drain's claim takes every event its coalesced wake-ups left it")
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
		next, err = other.TakeTurn(e.ctx)
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
	require.NoError(t, next.Wait(e.ctx, 10*time.Second))
	_, _, c, err = next.Claim(e.ctx)
	require.NoError(t, err)
	require.Len(t, c.Events, 1, "and its claim publishes the commit")
	_, err = c.Acknowledge(e.ctx)
	require.NoError(t, err)
}

// TestTurnWaitIsBounded: a drain that holds the turn past the wait's bound
// makes the waiting one give up with ErrTurnWait, and its next turn is
// free again.
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
	next := e.takeTurn(t, e.store)
	require.Equal(t, store.TurnNext, next.Role())
	require.ErrorIs(t, next.Wait(e.ctx, 100*time.Millisecond), store.ErrTurnWait)
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
	require.EqualValues(t, 2, e.count(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid::int = hashtext($1) AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		store.DrainTurnClass), "the turn and the next turn, both the first drain's; nothing of the coalesced one")
	held.End(e.ctx)
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
	t.Cleanup(pool.Close)
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
// waits in the server for the next turn, then for the turn, in its one
// statement, and returns holding both; its claim then takes every event
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
	require.ErrorIs(t, err, store.ErrTurnWait, "both turns held past the bound")
	require.EqualValues(t, 2, e.count(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid::int = hashtext($1) AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, store.DrainTurnClass),
		"the turn and the next turn, the first's and the next's; nothing of the one that gave up")

	tracer.statements.Store(0)
	queued := make(chan *store.Turn, 1)
	var turn *store.Turn
	t.Cleanup(func() {
		if turn == nil {
			turn = <-queued
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
	_, err = c.Acknowledge(e.ctx) // the first drain's turn ends
	require.NoError(t, err)
	require.NoError(t, next.Wait(e.ctx, 10*time.Second))
	_, _, nc, err := next.Claim(e.ctx) // it lets the next turn go
	require.NoError(t, err)
	require.Len(t, nc.Events, 2)
	require.EqualValues(t, 1, awaitTurnWait(t, e), "it holds the next turn and waits for the turn")
	e.products(t, 1) // committed while it waits: its claim takes it
	_, err = nc.Acknowledge(e.ctx)
	require.NoError(t, err)
	select {
	case turn = <-queued:
	case <-time.After(time.Minute):
		t.Fatal("the queued drain did not get the turn")
	}
	require.NotNil(t, turn)
	require.Equal(t, store.TurnTaken, turn.Role())
	require.True(t, turn.HoldsNext())
	require.True(t, turn.Queued())
	require.Positive(t, turn.Waited(), "it waited for the turn once it held the next turn")
	require.EqualValues(t, 1, tracer.statements.Load(), "one statement, which bounds its own waits")
	_, _, qc, err := turn.Claim(e.ctx)
	require.NoError(t, err)
	require.Len(t, qc.Events, 1, "the commit made while it waited")
	_, err = qc.Acknowledge(e.ctx)
	require.NoError(t, err)
}
