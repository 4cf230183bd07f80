package delivery_test

import (
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
)

// heldLimit is sizeLimit that first holds each request it will fail for
// its size, until open is closed.
type heldLimit struct {
	sizeLimit
	entered chan struct{}
	open    chan struct{}
}

// React implements pstest.Reactor.
func (l *heldLimit) React(req any) (bool, any, error) {
	for _, m := range req.(*pubsubpb.PublishRequest).Messages {
		if len(m.Data) > l.limit {
			l.entered <- struct{}{}
			<-l.open
			break
		}
	}
	return l.sizeLimit.React(req)
}

// TestAProbeLeavesTheEventsBehindToThePendingDrain: a drain whose lone
// event fails alone, while its instance's pending drain waits for the turn
// on the pool's other connection, does not claim the events behind the
// event itself (its claim would wait for that connection until the
// pending drain gave up): it ends its claim, and the pending drain takes
// its turn and drains them.
func TestAProbeLeavesTheEventsBehindToThePendingDrain(t *testing.T) {
	t.Parallel()
	limit := &heldLimit{sizeLimit: sizeLimit{limit: 1 << 20}, entered: make(chan struct{}, 8), open: make(chan struct{})}
	r := newRig(t, 2, withPublishReactor(limit), withService(func(c *delivery.Config) {
		c.QuietInterval = -1 // every wake-up takes turns
		// The pending drain waits for the turn while the lone event fails
		// alone and its probe gives up on a connection: on a busy machine
		// that took more than 10 s, the wait timed out, and the first drain
		// took the events on its next claim. A probe that waited for the
		// pending drain's connection would still hold it for the whole wait.
		c.TurnWait = time.Minute
	}))
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": strings.Repeat("x", 150_000)})
	require.NoError(t, err)
	// Larger than the SDK's byte bound: it comes in a batch of its own.
	_, err = r.pool.Exec(r.ctx, `UPDATE product_history SET replication = jsonb_set(replication, '{payload}', to_jsonb(repeat('x', 2 << 20)))`)
	require.NoError(t, err)
	for range 15 {
		_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "behind it"})
		require.NoError(t, err)
	}
	first := r.wakeUp(r.svc)
	<-limit.entered // its lone event's request is out
	_, err = r.w.Create(r.ctx, "product", map[string]any{"title": "committed later"})
	require.NoError(t, err)
	pending := r.wakeUp(r.svc)
	r.awaitTurnWaits(t, 1)
	close(limit.open) // the lone event fails alone
	f := await.Receive(t, first, "first")
	// It handed its commit over to the pending drain, or, when that one had
	// claimed already, queued again.
	require.NoError(t, f.err)
	require.True(t, f.res.HandedOver || f.res.Requeued > 0, "%+v", f.res)
	p := await.Receive(t, pending, "pending")
	require.NotErrorIs(t, p.err, store.ErrTurnWait)
	require.Equal(t, 16, p.res.Published+f.res.Published, "the events behind the one that fails are drained")
	require.Positive(t, p.res.Published, "by the pending drain: %+v", p.res)
	require.EqualValues(t, 1, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}
