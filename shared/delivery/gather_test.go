package delivery_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/store"
)

// awaitGathering waits, a minute at most, until a session of the rig's
// database holds w1's next turn and is idle: the drainer that took it has
// sent its last statement before its claim, and gathers.
func (r *rig) awaitGathering(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for r.count(t, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
		AND l.classid::int = hashtext($1) AND l.objid::bigint = 2
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND a.state = 'idle'`, store.DrainTurnClass) == 0 {
		require.True(t, time.Now().Before(deadline), "no drainer gathers on the next turn")
		time.Sleep(5 * time.Millisecond) // the server's lock table is the signal
	}
}

// TestAStopWhileGatheringKeepsThePromise: a drainer stopped (its
// process's SIGTERM) while it gathers on the next turn stops gathering and
// claims at once what it promised, publishes and acknowledges it within
// the grace, and lets the turns go: no lock of the turns stays, and
// nothing is left for another instance.
func TestAStopWhileGatheringKeepsThePromise(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2, busy(func(c *delivery.Config) { c.Gather = 10 * time.Second }))
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "gathered"})
	require.NoError(t, err)
	r.wakeOK(t, r.svc)
	r.awaitGathering(t)
	ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second) // half the gather: only a cut gathering ends within it
	defer cancel()
	require.NoError(t, r.svc.Shutdown(ctx))
	require.Zero(t, r.drainLocksHeld(t), "its turn ended with it")
	require.Zero(t, r.pendingCount(t), "the promised commit was claimed within the grace")
	require.EqualValues(t, 1, r.acceptedCount(t), "and acknowledged")
	other := r.newService()
	all, err := other.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{})
	require.NoError(t, err)
	require.Zero(t, all.Published, "nothing left for another instance")
}

// TestTheGatherCoalescesWakeUpsThatComeApart: on a busy workspace, while
// the drainer gathers on the next turn, wake-ups that come one after
// another (as one SDK writer's do, each awaited) join it, and one claim
// publishes their commits. Without the gather the drainer claims at once,
// and the later wake-ups get claims of their own.
func TestTheGatherCoalescesWakeUpsThatComeApart(t *testing.T) {
	t.Parallel()
	for _, gather := range []time.Duration{5 * time.Second, -1} {
		var counted *countingPublisher
		r := newRig(t, 2, withPublisher(func(p delivery.Publisher) delivery.Publisher {
			counted = &countingPublisher{Publisher: p}
			return counted
		}), busy(func(cfg *delivery.Config) { cfg.Gather = gather }))
		_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "first"})
		require.NoError(t, err)
		r.wakeOK(t, r.svc)
		if gather > 0 {
			r.awaitGathering(t)
		} else {
			r.settle(t)
		}
		coalesced := 0
		for i := range 4 {
			_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "apart", "stock": int64(i)})
			require.NoError(t, err)
			if r.wakeOK(t, r.svc).Coalesced {
				coalesced++
			}
			if gather < 0 {
				r.settle(t)
			}
		}
		r.settle(t)
		if gather > 0 {
			require.Equal(t, 4, coalesced, "every wake-up during the gather joins the drainer")
			require.EqualValues(t, 1, counted.requests.Load(), "one claim publishes them all")
		} else {
			require.EqualValues(t, 5, counted.requests.Load(), "without a gather each claims on its own")
		}
		require.Zero(t, r.pendingCount(t))
	}
}
