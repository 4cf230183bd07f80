package delivery_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
)

// TestShutdownFinishesTheBatchesOut: a stop (SIGTERM) while a batch is out
// answers later wake-ups ErrShuttingDown, and the drainer publishes and
// acknowledges the batch within the grace, claiming nothing more: the
// commit whose wake-up came after the stop began is left pending, for the
// next wake-up or the sweep.
func TestShutdownFinishesTheBatchesOut(t *testing.T) {
	t.Parallel()
	g := newGate()
	r := newRig(t, 2, withGate(g))
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "out"})
	require.NoError(t, err)
	r.drainHeld(t, g)
	shutdown := make(chan error, 1)
	ctx, cancel := context.WithTimeout(r.ctx, time.Minute)
	defer cancel()
	go func() { shutdown <- r.svc.Shutdown(ctx) }()
	require.Eventually(t, func() bool {
		_, err := r.wake(t, r.svc)
		return err != nil
	}, time.Minute, time.Millisecond)
	_, err = r.w.Create(r.ctx, "product", map[string]any{"title": "after the stop began"})
	require.NoError(t, err)
	_, err = r.wake(t, r.svc)
	require.ErrorIs(t, err, delivery.ErrShuttingDown)
	require.True(t, delivery.Transient(err), "a stopping instance answers 503")
	g.release()
	require.NoError(t, <-shutdown)
	require.EqualValues(t, 1, r.acceptedCount(t), "the batch out was acknowledged within the grace")
	require.EqualValues(t, 1, r.pendingCount(t), "nothing claimed after the stop began")
}
