package delivery_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
)

// TestShutdownFinishesTheBatchesOut: a stop (SIGTERM) while a batch is out
// answers later wake-ups ErrShuttingDown (no promise), and the drainer
// publishes and acknowledges the batch within the grace; it claims only
// what it promised: the commit whose wake-up was refused is left pending,
// for the next wake-up or the sweep.
func TestShutdownFinishesTheBatchesOut(t *testing.T) {
	t.Parallel()
	r, g := newRigWithABatchOut(t, "out")
	shutdown := r.beginShutdown(t)
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "after the stop began"})
	require.NoError(t, err)
	_, err = r.wake(t, r.svc)
	require.ErrorIs(t, err, delivery.ErrShuttingDown)
	require.True(t, delivery.Transient(err), "a stopping instance answers 503")
	g.release()
	require.NoError(t, <-shutdown)
	// The batch out was acknowledged within the grace. The refused
	// commit may have gone with a claim owed to a wake-up answered before
	// the stop (the loop above), or stays pending for the next wake-up.
	accepted := r.acceptedCount(t)
	require.GreaterOrEqual(t, accepted, int64(1), "the batch out was acknowledged within the grace")
	require.EqualValues(t, 2, accepted+r.pendingCount(t))
}

// TestAStopClaimsWhatWasPromised: a wake-up answered 2xx before the stop,
// whose commit the drainer had not claimed yet (its batch before was out),
// is claimed, published and acknowledged within the grace: on SIGTERM the
// drain ends its work, it does not leave a promise to the sweep.
func TestAStopClaimsWhatWasPromised(t *testing.T) {
	t.Parallel()
	r, g := newRigWithABatchOut(t, "out")
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "promised"})
	require.NoError(t, err)
	ans := r.wakeOK(t, r.svc)
	require.True(t, ans.Promised && ans.Coalesced, "%+v", ans)
	shutdown := r.beginShutdown(t)
	g.release()
	require.NoError(t, <-shutdown)
	require.Zero(t, r.pendingCount(t), "the promised commit was claimed after the stop began")
	require.EqualValues(t, 2, r.acceptedCount(t))
}

// beginShutdown stops the rig's service (a grace of a minute) and returns
// once it refuses wake-ups: the stop has begun. The channel gets
// Shutdown's result.
func (r *rig) beginShutdown(t *testing.T) <-chan error {
	t.Helper()
	shutdown := make(chan error, 1)
	ctx, cancel := context.WithTimeout(r.ctx, time.Minute)
	t.Cleanup(cancel)
	go func() { shutdown <- r.svc.Shutdown(ctx) }()
	require.Eventually(t, func() bool {
		_, err := r.wake(t, r.svc)
		return err != nil
	}, time.Minute, time.Millisecond, "the stop has begun")
	return shutdown
}
