package delivery_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// sessionsOpened returns a function that reports how many sessions the
// server opened on the rig's database since it was called
// (pgtest.SessionsOpened).
func (r *rig) sessionsOpened(tb testing.TB) func() int64 {
	tb.Helper()
	return pgtest.SessionsOpened(r.ctx, tb, r.url)
}

// TestDrainAllTakesOneRoundTripABatch: a bulk drain of 30 batches with four
// out at once holds one connection and takes about one round trip a batch:
// each acknowledges the batches whose publishes ended and claims the next.
// (Opening the session, the first claim's read of a table it had not met,
// and the claims that find the end of the queue add a few.)
func TestDrainAllTakesOneRoundTripABatch(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	require.NoError(t, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", 3000, 3000))
	opened := r.sessionsOpened(t)
	before := r.queries.n.Load()
	res, err := r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{Drains: 4})
	require.NoError(t, err)
	require.Equal(t, 3000, res.Published)
	trips := r.queries.n.Load() - before
	t.Logf("%d round trips for 30 batches", trips)
	require.LessOrEqual(t, trips, int64(30+16))
	require.EqualValues(t, 1, opened(), "one connection")
	r.requireEachAcknowledgedOnce(t, r.svc)
}

// TestDrainAllTakesTurnsWithWhile: While's pages and the drain take turns:
// a turn publishes everything pending and returns; between turns the drain
// claims nothing, whatever While writes; when While has returned, the drain
// publishes what is left.
func TestDrainAllTakesTurnsWithWhile(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	pending := func() int64 {
		return r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL")
	}
	write := func(n int) {
		// One commit each, as pages commit one after another: a drain that
		// claimed between turns would take some of them meanwhile.
		for i := range n {
			_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "between turns"})
			require.NoError(t, err)
			require.EqualValues(t, i+1, pending(), "nothing claimed between turns")
		}
	}
	turns := 0
	res, err := r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{Drains: 3, While: func(ctx context.Context, drain func(context.Context) error) error {
		for range 3 {
			write(120)
			require.NoError(t, drain(ctx))
			turns++
			require.Zero(t, pending(), "a turn publishes everything pending")
		}
		write(40)
		return nil
	}})
	require.NoError(t, err)
	require.Equal(t, 3, turns)
	require.Equal(t, 3*120+40, res.Published)
	r.requireEachAcknowledgedOnce(t, r.svc)
}

// flakyPublisher refuses the calls whose numbers fail lists (from 1), and
// every call from downFrom on when it is set, with UNAVAILABLE, as Pub/Sub
// does in an outage, and passes the others on.
type flakyPublisher struct {
	delivery.Publisher
	fail     map[int64]bool
	downFrom atomic.Int64
	calls    atomic.Int64
}

func (p *flakyPublisher) Publish(ctx context.Context, topic string, data [][]byte) ([]string, error) {
	n := p.calls.Add(1)
	if from := p.downFrom.Load(); p.fail[n] || (from > 0 && n >= from) {
		return nil, status.Error(codes.Unavailable, "injected outage")
	}
	return p.Publisher.Publish(ctx, topic, data)
}

// TestDrainAllProgressRenewsTheRetryBudget: a long drain meets a fault,
// makes progress, meets another: each fault after progress gets a new
// session with a budget of its own, so the drain finishes however many
// faults its length meets. The budget here is too short for any retry: the
// new sessions are what carries the drain on.
func TestDrainAllProgressRenewsTheRetryBudget(t *testing.T) {
	t.Parallel()
	flaky := &flakyPublisher{fail: map[int64]bool{2: true, 4: true}}
	r := newRig(t, 2, withPublisher(func(p delivery.Publisher) delivery.Publisher { flaky.Publisher = p; return flaky }),
		withService(func(c *delivery.Config) {
			c.Retry = delivery.RetryPolicy{Initial: 50 * time.Millisecond, Max: 50 * time.Millisecond, Budget: time.Millisecond}
		}))
	r.products(t, 500)
	res, err := r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{})
	require.NoError(t, err, "each fault came after progress")
	require.Equal(t, 500, res.Published)
	require.GreaterOrEqual(t, flaky.calls.Load(), int64(7), "five batches and the two refused publishes, at least")
	require.Zero(t, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))

	// Without progress first, the same budget gives up at the first fault
	// (Pub/Sub down from then on: a retry's pause is jittered from 0, so a
	// lone refusal might be retried within even a 1 ms budget).
	flaky.downFrom.Store(flaky.calls.Load() + 1)
	r.products(t, 10)
	_, err = r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{})
	require.ErrorContains(t, err, "injected outage")
}

// heldPublisher holds every Publish until released, saying when one is
// held (a pstest reactor cannot: the server holds its lock while reactors
// run, so a second request would wait for the first).
type heldPublisher struct {
	delivery.Publisher
	entered chan struct{}
	open    chan struct{}
}

func (p *heldPublisher) Publish(ctx context.Context, topic string, data [][]byte) ([]string, error) {
	p.entered <- struct{}{}
	select {
	case <-p.open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return p.Publisher.Publish(ctx, topic, data)
}

// TestDrainAllKeepsDrainsBatchesOut: with Drains 4, four batches are
// claimed and in Publish at once, and the drain finishes once Pub/Sub
// answers.
func TestDrainAllKeepsDrainsBatchesOut(t *testing.T) {
	t.Parallel()
	held := &heldPublisher{entered: make(chan struct{}, 100), open: make(chan struct{})}
	r := newRig(t, 2, withPublisher(func(p delivery.Publisher) delivery.Publisher { held.Publisher = p; return held }))
	r.products(t, 1000)
	done := make(chan error, 1)
	go func() {
		_, err := r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{Drains: 4})
		done <- err
	}()
	for i := range 4 {
		select {
		case <-held.entered:
		case err := <-done:
			t.Fatalf("the drain ended with %d batches out: %v", i, err)
		case <-time.After(time.Minute): // only when it never comes
			close(held.open)
			t.Fatalf("%d batches out at once, want 4", i)
		}
	}
	close(held.open)
	require.NoError(t, await.Receive(t, done, "done"))
	require.Zero(t, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}
