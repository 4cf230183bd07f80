package delivery_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
)

// awaitNextTurnHeld waits, a minute at most, until a session of the rig's
// database holds w1's next turn.
func (r *rig) awaitNextTurnHeld(t testing.TB) {
	t.Helper()
	r.awaitNextTurn(t, "")
}

// awaitGathering waits, a minute at most, until a session of the rig's
// database holds w1's next turn and is idle: the drain that took it has
// sent its last statement before its claim, and gathers.
func (r *rig) awaitGathering(t testing.TB) {
	t.Helper()
	r.awaitNextTurn(t, "idle")
}

// awaitNextTurn waits until a session holds w1's next turn, in state (any
// when empty).
func (r *rig) awaitNextTurn(t testing.TB, state string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for r.count(t, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
		AND l.classid::int = hashtext($1) AND l.objid::bigint = 2
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND ($2 = '' OR a.state = $2)`, store.DrainTurnClass, state) == 0 {
		require.True(t, time.Now().Before(deadline), "no drain holds the next turn (in state %q)", state)
		time.Sleep(5 * time.Millisecond) // the server's lock table is the signal
	}
}

// TestACancelledGatherLeavesNothingHeld: a wake-up whose request is
// cancelled while it gathers (it holds the next turn and the turn) ends its
// turn: no lock of the turns stays, and its connection goes back to the
// pool, so the next wake-up of any instance claims at once.
func TestACancelledGatherLeavesNothingHeld(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2, busy(func(c *delivery.Config) { c.Gather = 10 * time.Second }))
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "gathered"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan drained, 1)
	go func() {
		res, err := r.svc.Drain(ctx, "w1")
		done <- drained{res, err}
	}()
	// Cancelled once its session is idle, the drain is past its last
	// statement before the claim (a cancel that cuts a statement closes
	// the connection, and the server then ends the session on its own).
	r.awaitGathering(t)
	cancel()
	d := await.Receive(t, done, "the cancelled wake-up")
	require.ErrorIs(t, d.err, context.Canceled)
	require.Zero(t, r.drainLocksHeld(t), "its turn ended with it")
	other := r.newService()
	res, err := other.Drain(r.ctx, "w1")
	require.NoError(t, err)
	require.Equal(t, 1, res.Published, "another instance's wake-up claims at once")
}

// TestTheGatherCoalescesWakeUpsThatComeApart: on a busy workspace, while
// the drain that claims next gathers, wake-ups that come one after another
// (each after the one before has answered, as one SDK writer's do) are
// coalesced into it, and one claim publishes their commits. Without the
// gather that drain claims at once, and each later wake-up claims on its
// own.
func TestTheGatherCoalescesWakeUpsThatComeApart(t *testing.T) {
	t.Parallel()
	for _, gather := range []time.Duration{5 * time.Second, -1} {
		r := newRig(t, 2, busy(func(cfg *delivery.Config) { cfg.Gather = gather }))
		_, err := r.svc.Drain(r.ctx, "w1") // learns the capture tables
		require.NoError(t, err)
		_, err = r.w.Create(r.ctx, "product", map[string]any{"title": "first"})
		require.NoError(t, err)
		first := r.wakeUp(r.svc) // another writer's wake-up
		if gather > 0 {
			r.awaitNextTurnHeld(t) // it gathers
		} else {
			await.Receive(t, first, "the first drain")
		}
		batches, coalesced := 0, 0
		for i := range 4 {
			_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "apart", "stock": int64(i)})
			require.NoError(t, err)
			res, err := r.svc.Drain(r.ctx, "w1")
			require.NoError(t, err)
			batches += res.Batches
			if res.Coalesced {
				coalesced++
			}
		}
		if gather > 0 {
			d := await.Receive(t, first, "the drain that gathered")
			require.Equal(t, 4, coalesced, "every wake-up during the gather is coalesced")
			require.Equal(t, 1, d.res.Batches, "one claim publishes them all")
			require.Equal(t, 5, d.res.Published)
		} else {
			require.Zero(t, coalesced, "without a gather each claims on its own")
			require.Equal(t, 4, batches)
		}
		require.Zero(t, r.pendingCount(t))
	}
}
