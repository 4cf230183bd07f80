package store_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// session returns a new drain session of st, closed when the test ends.
func session(t testing.TB, st *store.Store) *store.Session {
	t.Helper()
	ss := st.NewSession()
	t.Cleanup(func() { ss.Close(context.Background()) })
	return ss
}

// claimOn claims on ss, finishing nothing, and returns the claim.
func claimOn(t testing.TB, e *env, ss *store.Session) *store.Claim {
	t.Helper()
	_, _, c, err := ss.Next(e.ctx, nil, true)
	require.NoError(t, err)
	require.NotNil(t, c)
	return c
}

// turnLocksHeld counts the locks of the drain's turns held in e's
// database.
func turnLocksHeld(t testing.TB, e *env) int64 {
	t.Helper()
	return e.count(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid::int = hashtext($1) AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, store.DrainTurnClass)
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

// TestTurnsCoalesceClaims: of the drain sessions of a workspace, whichever
// process they are in, one holds the next turn at a time and the others
// wait for it in the server; a claim on the turn lets the next turn go
// before it reads and the turn after, so the session waiting claims next,
// while the first claim's batch is still out, and takes what was committed
// after that claim: every commit before its wait ended, the one made while
// it held the next turn too.
func TestTurnsCoalesceClaims(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	other := otherProcess(t, e)
	e.products(t, 1)
	first := session(t, e.store)
	_, err := first.QueueTurn(e.ctx, time.Minute)
	require.NoError(t, err)
	require.True(t, first.HoldsNext())
	require.EqualValues(t, 2, turnLocksHeld(t, e), "a free turn is taken with the next turn")

	second := session(t, other)
	queued := make(chan error, 1)
	go func() { _, err := second.QueueTurn(e.ctx, time.Minute); queued <- err }()
	require.EqualValues(t, 2, awaitTurnWait(t, e), "it waits for the next turn")

	c := claimOn(t, e, first)
	require.Len(t, c.Events, 1, "the first claim; its batch is out")
	require.False(t, first.HoldsNext())
	require.NoError(t, await.Receive(t, queued, "the second session's wait"))
	require.True(t, second.HoldsNext())
	e.products(t, 2) // committed while it holds the next turn: its claim takes them
	sc := claimOn(t, e, second)
	require.Len(t, sc.Events, 2, "it claims while the first batch is out: the turn is not held across a publish")
	require.Zero(t, turnLocksHeld(t, e), "each claim let both turns go")
	for _, pair := range []struct {
		ss *store.Session
		c  *store.Claim
	}{{first, c}, {second, sc}} {
		_, _, _, err := pair.ss.Next(e.ctx, []store.Finishing{{Claim: pair.c, Accepted: pair.c.IDs()}}, false)
		require.NoError(t, err)
	}
	require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}

// TestTurnWaitIsBounded: a session that waits for the next turn past its
// bound gives up with ErrTurnWait and holds no lock of the turns; its
// claim, made with no turn then, is the session's own.
func TestTurnWaitIsBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	e.products(t, 1)
	holder := session(t, e.store)
	_, err := holder.QueueTurn(e.ctx, time.Minute)
	require.NoError(t, err)
	waiter := session(t, otherProcess(t, e))
	_, err = waiter.QueueTurn(e.ctx, 100*time.Millisecond)
	require.ErrorIs(t, err, store.ErrTurnWait)
	require.False(t, waiter.HoldsNext())
	require.EqualValues(t, 2, turnLocksHeld(t, e), "the holder's; nothing of the one that gave up")
	holder.LeaveTurn(e.ctx)
	require.Zero(t, turnLocksHeld(t, e))
}

// TestLeaveTurnKeepsTheClaimsOut: a session that lets its turns go without
// a claim (its drainer stopping) keeps the claims of its batches out.
func TestLeaveTurnKeepsTheClaimsOut(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	e.products(t, 2)
	ss := session(t, e.store)
	c := claimOn(t, e, ss)
	require.Len(t, c.Events, 2)
	_, err := ss.QueueTurn(e.ctx, time.Minute)
	require.NoError(t, err)
	ss.LeaveTurn(e.ctx)
	require.Zero(t, turnLocksHeld(t, e))
	require.Len(t, e.claimHolders(t), 1, "its batch's claim is still out")
	_, _, _, err = ss.Next(e.ctx, []store.Finishing{{Claim: c, Accepted: c.IDs()}}, false)
	require.NoError(t, err)
	require.Empty(t, e.claimHolders(t))
}

// TestClaimTellsALifecycleWaitFromATurnWait: a claim on the next turn whose
// first statement waits for the turn past its bound (another session holds
// it) fails with ErrTurnWait; one that takes the turn and then finds the
// lifecycle lock held (a migration) past the store's lock timeout fails
// with the lock timeout, not ErrTurnWait. Neither leaves a lock of the
// turns behind.
func TestClaimTellsALifecycleWaitFromATurnWait(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	e.products(t, 1)
	pool, err := pgxpool.New(e.ctx, e.pool.Config().ConnString())
	require.NoError(t, err)
	closeBounded(t, pool)
	st, err := store.New(pool, store.Config{LockTimeout: 100 * time.Millisecond})
	require.NoError(t, err)

	// The turn held by another session (a claim in progress, as long as
	// the test likes).
	blocker, err := pgx.ConnectConfig(e.ctx, e.pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	t.Cleanup(func() { _ = blocker.Close(e.ctx) })
	_, err = blocker.Exec(e.ctx, `SELECT pg_advisory_lock(hashtext($1), 1)`, store.DrainTurnClass)
	require.NoError(t, err)
	ss := session(t, st)
	_, err = ss.QueueTurn(e.ctx, 200*time.Millisecond)
	require.NoError(t, err, "the next turn is free")
	_, _, _, err = ss.Next(e.ctx, nil, true)
	require.ErrorIs(t, err, store.ErrTurnWait, "the turn held past the bound")
	require.EqualValues(t, 1, turnLocksHeld(t, e), "the blocker's turn only")
	_, err = blocker.Exec(e.ctx, `SELECT pg_advisory_unlock_all()`)
	require.NoError(t, err)

	migration, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = migration.Rollback(e.ctx) })
	_, err = migration.Exec(e.ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, store.LifecycleLock)
	require.NoError(t, err)
	ss = session(t, st)
	_, err = ss.QueueTurn(e.ctx, time.Minute)
	require.NoError(t, err)
	_, _, _, err = ss.Next(e.ctx, nil, true)
	require.Error(t, err)
	require.NotErrorIs(t, err, store.ErrTurnWait, "the claim took the turn: the lifecycle lock timed out")
	require.Zero(t, turnLocksHeld(t, e), "the failed claim let both turns go")
}

// statementCounter counts the statements a connection sends (a pipeline's
// each), by their first words.
type statementCounter struct {
	statements atomic.Int64
	touches    atomic.Int64
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.statements.Add(1)
	if strings.TrimSpace(d.SQL) == "SELECT 1" {
		c.touches.Add(1)
	}
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
func tracedStore(t testing.TB, e *env, tracer pgx.QueryTracer, cfg store.Config) *store.Store {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(e.pool.Config().ConnString())
	require.NoError(t, err)
	pcfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(e.ctx, pcfg)
	require.NoError(t, err)
	closeBounded(t, pool)
	st, err := store.New(pool, cfg)
	require.NoError(t, err)
	return st
}

// TestAQuietDrainIsSixStatements: a session's one claim and its
// acknowledgement, as a quiet workspace's drainer makes them, cost the
// database two round trips and six statements: the claim's settings and
// lifecycle lock, the state with its target, and the candidates; then the
// lifecycle lock, the acknowledgement and the unlock. Taking the next turn
// first is one more statement, and the claim on it one more (the turn let
// go after its candidates).
func TestAQuietDrainIsSixStatements(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	tracer := &statementCounter{}
	st := tracedStore(t, e, tracer, store.Config{})
	for i, busy := range []bool{false, false, true} { // the first learns the capture tables
		e.products(t, 1)
		ss := st.NewSession()
		before := tracer.statements.Load()
		if busy {
			_, err := ss.QueueTurn(e.ctx, time.Minute)
			require.NoError(t, err)
		}
		c := claimOn(t, e, ss)
		require.Len(t, c.Events, 1)
		_, _, _, err := ss.Next(e.ctx, []store.Finishing{{Claim: c, Accepted: c.IDs()}}, false)
		require.NoError(t, err)
		ss.Close(e.ctx)
		want := int64(6)
		if busy {
			want = 8
		}
		if i > 0 {
			require.Equal(t, want, tracer.statements.Load()-before, "busy: %v", busy)
		}
	}
	require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}

// TestAFrozenTurnHolderIsEnded: a session that froze while it held the
// next turn (its process stopped during its gathering) is ended by the
// server after the store's IdleTimeout (the idle_session_timeout its turn's
// statement set), which frees the turns: another session's QueueTurn then
// takes them instead of failing with ErrTurnWait.
func TestAFrozenTurnHolderIsEnded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	pool, err := pgxpool.New(e.ctx, e.pool.Config().ConnString())
	require.NoError(t, err)
	closeBounded(t, pool)
	frozen, err := store.New(pool, store.Config{IdleTimeout: time.Second})
	require.NoError(t, err)
	ss := session(t, frozen)
	_, err = ss.QueueTurn(e.ctx, time.Minute)
	require.NoError(t, err)
	// The process freezes: nothing more is sent on the session.
	next := session(t, otherProcess(t, e))
	_, err = next.QueueTurn(e.ctx, 20*time.Second)
	require.NoError(t, err, "the server ended the frozen holder within the bound")
	require.True(t, next.HoldsNext())
}

// TestATurnLeavesNoIdleTimeoutBehind: the idle_session_timeout a turn's
// statement sets lasts as long as the session's locks: a turn left without
// a claim, a claim on a turn that found nothing, and one acknowledged each
// give the pool's connection back with the session's own setting.
func TestATurnLeavesNoIdleTimeoutBehind(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"left", "claimed nothing", "acknowledged"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, &sdkfixture.V4Template)
			e.start(t)
			cfg, err := pgxpool.ParseConfig(e.pool.Config().ConnString())
			require.NoError(t, err)
			cfg.MaxConns = 1
			pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
			require.NoError(t, err)
			closeBounded(t, pool)
			st, err := store.New(pool, store.Config{IdleTimeout: 7 * time.Second})
			require.NoError(t, err)
			var setting string
			require.NoError(t, pool.QueryRow(e.ctx, "SHOW idle_session_timeout").Scan(&setting))
			require.Equal(t, "0", setting, "the session's own setting")
			if end == "acknowledged" {
				e.products(t, 1)
			}
			ss := st.NewSession()
			_, err = ss.QueueTurn(e.ctx, time.Minute)
			require.NoError(t, err)
			switch end {
			case "left":
				ss.LeaveTurn(e.ctx)
			default:
				_, _, c, err := ss.Next(e.ctx, nil, true)
				require.NoError(t, err)
				if len(c.Events) > 0 {
					_, _, _, err = ss.Next(e.ctx, []store.Finishing{{Claim: c, Accepted: c.IDs()}}, false)
					require.NoError(t, err)
				}
			}
			ss.Close(e.ctx)
			require.NoError(t, pool.QueryRow(e.ctx, "SHOW idle_session_timeout").Scan(&setting))
			require.Equal(t, "0", setting, "the turn's setting is gone with the session's locks")
			require.Zero(t, turnLocksHeld(t, e))
		})
	}
}
