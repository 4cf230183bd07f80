package delivery_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
)

// TestWakeUpsCoalesceAcrossInstances: while a drain's batch is out, the
// wake-ups of later commits on two instances (each with its own pool) start
// no claim of their own: one waits for the drain's turn and the others are
// coalesced at once, one statement each at most; when the batch is
// acknowledged, the waiting one publishes every commit the others left it,
// in one batch.
func TestWakeUpsCoalesceAcrossInstances(t *testing.T) {
	t.Parallel()
	g := newGate()
	// Every wake-up takes turns, as on a busy workspace.
	r := newRig(t, 2, withPublishReactor(g), withService(func(c *delivery.Config) { c.QuietInterval = -1 }))
	instances := []*delivery.Service{r.svc, r.newService()}
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "first"})
	require.NoError(t, err)
	first := r.drainHeld(g) // its batch is out
	defer g.release()

	const wakeUps = 10
	for i := range wakeUps {
		_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "later", "stock": int64(i)})
		require.NoError(t, err)
	}
	before := r.queries.n.Load()
	results := make(chan drained, wakeUps)
	for i := range wakeUps {
		svc := instances[i%2]
		go func() {
			res, err := svc.Drain(r.ctx, "w1")
			results <- drained{res, err}
		}()
	}
	// All but the one waiting for the turn answer while the batch is out.
	waitFor := func() drained {
		t.Helper()
		select {
		case d := <-results:
			return d
		case <-time.After(time.Minute):
			t.Fatal("a wake-up did not answer: it claimed on its own, and its publish is held")
			return drained{}
		}
	}
	for range wakeUps - 1 {
		d := waitFor()
		require.NoError(t, d.err)
		require.True(t, d.res.Coalesced, "coalesced: %+v", d.res)
		require.Zero(t, d.res.Published)
	}
	require.LessOrEqual(t, r.queries.n.Load()-before, int64(wakeUps), "a round trip per wake-up at most (the waiting one's included)")

	g.release()
	f := <-first
	require.NoError(t, f.err)
	require.Equal(t, 1, f.res.Published)
	d := waitFor()
	require.NoError(t, d.err)
	require.False(t, d.res.Coalesced)
	require.Equal(t, wakeUps, d.res.Published, "the waiting wake-up publishes every commit the others left it")
	require.Equal(t, 1, d.res.Batches)
	require.Positive(t, d.res.Waited)
	r.requireEachAcknowledgedOnce(t, r.svc)
}

// TestQuietWorkspaceDrainsAtOnce: a single commit on a quiet workspace is
// published by its own wake-up, which neither waits nor is coalesced, with
// the statements of a claim and an acknowledgement only (no turn).
func TestQuietWorkspaceDrainsAtOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2)
	for i := range 3 {
		_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "alone"})
		require.NoError(t, err)
		before := r.queries.n.Load()
		res, err := r.svc.Drain(context.Background(), "w1")
		if i > 0 { // the first also reads the capture tables and learns the product's
			require.EqualValues(t, 2, r.queries.n.Load()-before, "the claim and the acknowledgement: two round trips")
		}
		require.NoError(t, err)
		require.Equal(t, 1, res.Published)
		require.False(t, res.Coalesced)
		require.Zero(t, res.Waited)
	}
}
