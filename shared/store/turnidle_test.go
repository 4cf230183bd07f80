package store_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// frozenStore is a Store over a pool of its own (one connection) whose
// turns carry a TurnIdleTimeout of idle.
func frozenStore(t testing.TB, e *env, idle time.Duration) (*store.Store, *pgxpool.Pool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(e.pool.Config().ConnString())
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	require.NoError(t, err)
	closeBounded(t, pool)
	st, err := store.New(pool, store.Config{TurnIdleTimeout: idle})
	require.NoError(t, err)
	return st, pool
}

// awaitNoTurnLocks waits, at most a minute, until no session of e's
// database holds a lock of the drain's turns.
func awaitNoTurnLocks(t testing.TB, e *env, why string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for turnLocksHeld(t, e) > 0 {
		require.True(t, time.Now().Before(deadline), "the turn locks are still held a minute later: %s", why)
		time.Sleep(20 * time.Millisecond) // polling the server's lock table: the signal itself
	}
}

// TestAFrozenTurnHolderIsEnded: a drain that froze while it held the turn
// and the next turn (its process stopped during its gathering), or while
// its claim's batch was out, is ended by the server after TurnIdleTimeout
// (the idle_session_timeout the turn's statement set), which frees both
// turns: another drain's QueueTurn then takes them at once instead of
// failing with ErrTurnWait. Each way of taking a turn sets it.
func TestAFrozenTurnHolderIsEnded(t *testing.T) {
	t.Parallel()
	for _, way := range []string{"QueueTurn", "TakeTurn", "claim on the turn"} {
		t.Run(way, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, &sdkfixture.V4Template)
			e.start(t)
			e.products(t, 1)
			frozen, _ := frozenStore(t, e, time.Second)
			var turn *store.Turn
			var err error
			if way == "TakeTurn" {
				turn, err = frozen.TakeTurn(e.ctx, time.Minute)
			} else {
				turn, err = frozen.QueueTurn(e.ctx, time.Minute)
			}
			require.NoError(t, err)
			require.Equal(t, store.TurnTaken, turn.Role())
			if way == "claim on the turn" {
				_, _, c, err := turn.Claim(e.ctx)
				require.NoError(t, err)
				require.Len(t, c.Events, 1, "its batch is out, and its process freezes")
				defer c.Release(e.ctx) // when it thaws: its session has gone
			} else {
				defer turn.End(e.ctx)
			}
			// The process freezes: nothing more is sent on the session.
			awaitNoTurnLocks(t, e, "a frozen holder is ended after TurnIdleTimeout")
			other := otherProcess(t, e)
			next, err := other.QueueTurn(e.ctx, time.Second)
			require.NoError(t, err, "the turns are free again")
			require.Equal(t, store.TurnTaken, next.Role())
			next.End(e.ctx)
		})
	}
}

// TestATurnLeavesNoIdleTimeoutBehind: the idle_session_timeout a turn's
// statement sets lasts as long as the turn: a turn ended without a claim,
// a claim on a turn that found nothing, and one acknowledged each give the
// pool's connection back with the session's own setting.
func TestATurnLeavesNoIdleTimeoutBehind(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"ended", "claimed nothing", "acknowledged", "taken, not queued"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, &sdkfixture.V4Template)
			e.start(t)
			st, pool := frozenStore(t, e, 7*time.Second)
			var setting string
			require.NoError(t, pool.QueryRow(e.ctx, "SHOW idle_session_timeout").Scan(&setting))
			require.Equal(t, "0", setting, "the session's own setting")
			if end == "acknowledged" {
				e.products(t, 1)
			}
			var turn *store.Turn
			var err error
			if end == "taken, not queued" {
				turn, err = st.TakeTurn(e.ctx, time.Minute)
			} else {
				turn, err = st.QueueTurn(e.ctx, time.Minute)
			}
			require.NoError(t, err)
			switch end {
			case "ended", "taken, not queued":
				turn.End(e.ctx)
			default:
				_, _, c, err := turn.Claim(e.ctx)
				require.NoError(t, err)
				if c != nil {
					_, err = c.Acknowledge(e.ctx)
					require.NoError(t, err)
				}
			}
			require.NoError(t, pool.QueryRow(e.ctx, "SHOW idle_session_timeout").Scan(&setting))
			require.Equal(t, "0", setting, "the turn's setting is gone with the turn")
			require.Zero(t, turnLocksHeld(t, e))
		})
	}
}
