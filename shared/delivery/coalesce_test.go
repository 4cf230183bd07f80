package delivery_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
)

// countingPublisher counts the Publish requests a Service sends.
type countingPublisher struct {
	delivery.Publisher
	requests atomic.Int64
}

func (c *countingPublisher) Publish(ctx context.Context, topic string, data [][]byte) ([]string, error) {
	c.requests.Add(1)
	return c.Publisher.Publish(ctx, topic, data)
}

// TestWakeUpsCoalesceAcrossInstances: while a drainer's batch is out, the
// wake-ups of ten later commits on two instances (each with its own pool)
// are answered at once, without a statement each: on each instance the
// wake-ups count themselves into the one drainer, which takes the
// workspace's next turn (one statement; the second instance's waits for it
// in the server) and gathers. Their commits go in one batch: the first
// drainer to claim takes all ten, the other finds nothing left.
func TestWakeUpsCoalesceAcrossInstances(t *testing.T) {
	t.Parallel()
	g := newGate()
	var counted *countingPublisher
	// Every claim takes turns, as on a busy workspace; the gather is long
	// enough for every wake-up to come before the first claim on a turn.
	r := newRig(t, 2, withGate(g), withPublisher(func(p delivery.Publisher) delivery.Publisher {
		if counted == nil {
			counted = &countingPublisher{Publisher: p}
		}
		return counted
	}), busy(func(c *delivery.Config) { c.Gather = time.Second }))
	instances := []*delivery.Service{r.svc, r.newService()}
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "first"})
	require.NoError(t, err)
	r.drainHeld(t, g) // its batch is out
	defer g.release()
	before := counted.requests.Load()

	const wakeUps = 10
	queries := r.queries.n.Load()
	started := 0
	for i := range wakeUps {
		_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "later", "stock": int64(i)})
		require.NoError(t, err)
		ans := r.wakeOK(t, instances[i%2])
		if !ans.Coalesced {
			started++
		}
	}
	require.Equal(t, 1, started, "one drainer started, on the second instance; the others joined the running ones")
	r.awaitTurnWaits(t, 1) // one drainer holds the next turn, the other waits for it
	require.LessOrEqual(t, r.queries.n.Load()-queries, int64(2),
		"a round trip per drainer for the next turn, none per wake-up")

	g.release()
	r.settle(t, instances...)
	require.Zero(t, r.pendingCount(t))
	require.EqualValues(t, 1, counted.requests.Load()-before, "one request for the ten commits")
	r.requireEachAcknowledgedOnce(t, r.svc)
}

// TestAWakeUpAfterTheClaimGetsAClaimOfItsOwn: a commit whose wake-up
// reaches the instance after its drainer claimed (the batch is out) is not
// left to that batch, whose claim did not see it: the drainer claims again
// at once, beside the batch out, and publishes it in a batch of its own.
func TestAWakeUpAfterTheClaimGetsAClaimOfItsOwn(t *testing.T) {
	t.Parallel()
	r, g := newRigWithABatchOut(t, "first")
	defer g.release()
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "after the claim"})
	require.NoError(t, err)
	require.True(t, r.wakeOK(t, r.svc).Coalesced, "the running drainer takes it")
	await.Receive(t, g.entered, "the second batch's publish, while the first is out")
	g.release()
	r.settle(t)
	require.Zero(t, r.pendingCount(t))
	require.Len(t, r.srv.Messages(), 2)
}

// TestQuietWorkspaceDrainsAtOnce: a single commit on a quiet workspace is
// published by the drainer its wake-up starts, which takes no turn: the
// claim and the acknowledgement, two round trips and six statements.
func TestQuietWorkspaceDrainsAtOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2)
	for i := range 3 {
		_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "alone"})
		require.NoError(t, err)
		before := r.queries.n.Load()
		ans := r.wakeOK(t, r.svc)
		require.False(t, ans.Coalesced)
		r.settle(t)
		if i > 0 { // the first also reads the capture tables and learns the product's
			require.EqualValues(t, 2, r.queries.n.Load()-before, "the claim and the acknowledgement: two round trips")
		}
		require.EqualValues(t, i+1, r.acceptedCount(t))
	}
}
