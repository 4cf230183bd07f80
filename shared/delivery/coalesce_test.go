package delivery_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
)

// TestWakeUpsCoalesceAcrossInstances: while a drain's batch is out, the
// wake-ups of later commits on two instances (each with its own pool)
// start no claim of their own while it is out. On each instance one is the
// pending drain: one holds the next turn and its claim waits in the server
// for the turn, the other waits in the server for the next turn (one
// statement); the others are coalesced into them at once, without a
// statement. When the
// batch is acknowledged, the first pending drain publishes every commit in
// one batch; the other, whose turn comes after, finds nothing left.
func TestWakeUpsCoalesceAcrossInstances(t *testing.T) {
	t.Parallel()
	g := newGate()
	// Every wake-up takes turns, as on a busy workspace. The gather is
	// long enough for every wake-up to reach its instance before the drain
	// that holds the next turn sends its claim (a wake-up after that is the
	// instance's next pending drain).
	r := newRig(t, 2, withPublishReactor(g), withService(func(c *delivery.Config) {
		c.QuietInterval = -1
		c.Gather = time.Second
	}))
	instances := []*delivery.Service{r.svc, r.newService()}
	for _, svc := range instances { // each learns the capture tables, a round trip of its first claim
		_, err := svc.Drain(r.ctx, "w1")
		require.NoError(t, err)
	}
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
	// All but the two pending drains answer while the batch is out.
	for range wakeUps - 2 {
		d := waitFor()
		require.NoError(t, d.err)
		require.True(t, d.res.Coalesced, "coalesced: %+v", d.res)
		require.Equal(t, "instance", d.res.CoalescedBy)
		require.Zero(t, d.res.Published)
	}
	r.awaitTurnWaits(t, 2) // one for the turn, the other for the next turn
	require.EqualValues(t, 3, r.queries.n.Load()-before,
		"a round trip per pending drain, and the claim of the one next, which waits for the turn; none per coalesced wake-up")

	g.release()
	f := await.Receive(t, first, "first")
	require.NoError(t, f.err)
	require.Equal(t, 1, f.res.Published)
	pending := []drained{waitFor(), waitFor()}
	slices.SortFunc(pending, func(a, b drained) int { return b.res.Published - a.res.Published })
	for _, d := range pending {
		require.NoError(t, d.err)
		require.False(t, d.res.Coalesced)
		require.Positive(t, d.res.Waited)
	}
	require.Equal(t, wakeUps, pending[0].res.Published, "the first pending drain publishes every commit the others left it")
	require.Equal(t, 1, pending[0].res.Batches)
	require.Zero(t, pending[1].res.Published, "the second found nothing left")
	r.requireEachAcknowledgedOnce(t, r.svc)
}

// TestAWakeUpAfterTheClaimIsNotCoalescedIntoIt: a commit whose wake-up
// reaches the instance after its drain claimed (the batch is out) is not
// left to that drain, whose claim did not see it: the wake-up is the
// instance's next pending drain, waits for the turn, and publishes it.
func TestAWakeUpAfterTheClaimIsNotCoalescedIntoIt(t *testing.T) {
	t.Parallel()
	g := newGate()
	r := newRig(t, 2, withPublishReactor(g), withService(func(c *delivery.Config) { c.QuietInterval = -1 }))
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "first"})
	require.NoError(t, err)
	first := r.drainHeld(g)
	defer g.release()
	_, err = r.w.Create(r.ctx, "product", map[string]any{"title": "after the claim"})
	require.NoError(t, err)
	later := r.wakeUp(r.svc)
	r.awaitTurnWaits(t, 1)
	select {
	case d := <-later:
		t.Fatalf("the wake-up answered while the batch was out: %+v, %v", d.res, d.err)
	default:
	}
	g.release()
	require.NoError(t, await.Receive(t, first, "first").err)
	d := await.Receive(t, later, "later")
	require.NoError(t, d.err)
	require.False(t, d.res.Coalesced)
	require.Equal(t, 1, d.res.Published)
	require.Zero(t, r.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL`))
}

// awaitTurnWaits waits until n drains of the rig's database wait in the
// server for a turn (the server's lock table is the signal).
func (r *rig) awaitTurnWaits(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for r.count(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid::int = hashtext($1)
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, store.DrainTurnClass) < n {
		require.True(t, time.Now().Before(deadline), "%d drains do not wait for a turn", n)
		time.Sleep(5 * time.Millisecond)
	}
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
