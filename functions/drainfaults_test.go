package functions

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
)

// TestDrainPublishFailureAcknowledgesNothing: a Pub/Sub outage meets the
// drainer of a wake-up answered 200: it acknowledges nothing, backs off
// (never longer than its cap: the backoff the log gives) and answers the
// wake-ups meanwhile 503, saying the commit is left to it; when Pub/Sub is
// back it publishes every commit with no other wake-up.
func TestDrainPublishFailureAcknowledgesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.products("w1", 5)
	h.faults.set(status.Error(codes.Unavailable, "injected outage"))
	code, body := h.wake("w1")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, true, body["promised"])
	h.awaitLogged(delivery.LogDrainFault)
	code, body = h.wake("w1")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body["error"], "left to the drain")
	require.Contains(t, h.logs.String(), `"cause":"drain_retrying"`)
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL"))
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"))

	h.faults.set(nil)
	h.settle()
	require.Len(t, h.published("w1"), 5)
	require.EqualValues(t, 5, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"))
	for _, backoff := range h.logged(delivery.LogDrainFault, "backoff_ms") {
		require.LessOrEqual(t, backoff, 5000.0, "a transient fault's backoff is capped at 5 s")
	}
}

// TestDrainLostPublishResponseOnlyDuplicates: a Publish whose answer is
// lost after Pub/Sub stored the batch is not acknowledged; the drainer
// claims again after its backoff and publishes the batch again. A
// duplicate, never a loss.
func TestDrainLostPublishResponseOnlyDuplicates(t *testing.T) {
	t.Parallel()
	var lose atomic.Bool
	lose.Store(true)
	h := newHarness(t, withInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if strings.HasSuffix(method, "/Publish") && lose.CompareAndSwap(true, false) {
			return status.Error(codes.DeadlineExceeded, "response lost after the server stored the messages")
		}
		return err
	}))
	h.products("w1", 4)
	code, body := h.wake("w1")
	require.Equal(t, http.StatusOK, code, body)
	h.settle()
	ids := map[string]int{}
	for _, e := range h.published("w1") {
		ids[e.EventID]++
	}
	require.Len(t, ids, 4)
	for id, n := range ids {
		require.Equal(t, 2, n, "event %s: a duplicate, never a loss", id)
	}
	require.EqualValues(t, 4, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"), "acknowledged once, after the second publish")
}

// TestDrainDatabaseDroppedBetweenPublishAndAcknowledge: the drainer's
// sessions cut while Pub/Sub stores its batch: nothing is acknowledged
// that round; the drainer claims again on a new connection, publishes the
// batch again and acknowledges it.
func TestDrainDatabaseDroppedBetweenPublishAndAcknowledge(t *testing.T) {
	t.Parallel()
	var drop atomic.Bool
	var h *harness
	h = newHarness(t, withReactor(pstest.ServerReactorOption{FuncName: "Publish", Reactor: reactorFunc(func(req any) (bool, any, error) {
		if drop.CompareAndSwap(true, false) {
			// Cut the drain's database connections while Pub/Sub stores the batch.
			conn, err := pgx.Connect(context.Background(), pgtest.Shared(h.t).AdminURL())
			if err == nil {
				_, err = conn.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
					WHERE application_name = 'ontology-replication' AND datname = $1`, dbName(h.spaces["w1"].url))
				_ = conn.Close(context.Background())
			}
			assert.NoError(h.t, err)
		}
		return false, nil, nil
	})}))
	h.products("w1", 3)
	drop.Store(true)
	code, body := h.wake("w1")
	require.Equal(t, http.StatusOK, code, body)
	h.settle()
	require.GreaterOrEqual(t, len(h.published("w1")), 6, "the batch twice: a duplicate, never a loss")
	require.EqualValues(t, 3, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"))
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}

// TestConcurrentWakeUpsTakeDisjointBatches: four instances' drainers,
// woken at once on a backlog, take disjoint batches: every event is
// published and acknowledged exactly once.
func TestConcurrentWakeUpsTakeDisjointBatches(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.products("w1", 1000)
	instances := []http.Handler{h.handler, h.instance(), h.instance(), h.instance()}
	var wg sync.WaitGroup
	for _, in := range instances {
		wg.Go(func() {
			code, body := h.wakeOn(in, "w1")
			assert.Equal(t, http.StatusOK, code, body)
		})
	}
	wg.Wait()
	h.settle()
	require.Equal(t, 1000, h.runs("w1").count, "every event acknowledged exactly once")
	ids := map[string]int{}
	for _, e := range h.published("w1") {
		ids[e.EventID]++
	}
	require.Len(t, ids, 1000, "every event published")
	duplicates := len(h.published("w1")) - len(ids)
	require.Zero(t, duplicates, "claims are disjoint: no event published twice")
	require.EqualValues(t, 1000, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"))
}

// publishCounter is a pstest reactor that counts Publish requests and
// refuses (INVALID_ARGUMENT, as Pub/Sub does for a message it can never
// take) every request holding a message that contains one of its marks.
type publishCounter struct {
	requests atomic.Int64
	refusing atomic.Bool
	marks    []string
}

func (p *publishCounter) React(req any) (bool, any, error) {
	p.requests.Add(1)
	if !p.refusing.Load() {
		return false, nil, nil
	}
	for _, m := range req.(*pubsubpb.PublishRequest).Messages {
		for _, mark := range p.marks {
			if strings.Contains(string(m.Data), mark) {
				return true, nil, status.Error(codes.InvalidArgument, "message rejected")
			}
		}
	}
	return false, nil, nil
}

// backoffPasses moves every set-aside event's backoff into the past, as the
// passing of time would.
func (h *harness) backoffPasses(workspace string) {
	_, err := h.spaces[workspace].pool.Exec(h.ctx, `UPDATE _ontology_replication_delivery
		SET next_verify_at = now() - (next_verify_at - last_checked_at), last_checked_at = now() - 2 * (next_verify_at - last_checked_at)
		WHERE accepted_at IS NULL AND last_checked_at IS NOT NULL`)
	require.NoError(h.t, err)
}

// TestPoisonEventDoesNotBlockTheQueue: one event Pub/Sub refuses, in the
// middle of a batch: the other 99 are published and acknowledged, finding
// it costs at most 2 + ⌈log₂ 100⌉ requests, it is logged once, and no
// drain of this or another instance sends it again until its backoff has
// passed; then one request, alone, per backoff; once Pub/Sub takes it, it
// is delivered.
func TestPoisonEventDoesNotBlockTheQueue(t *testing.T) {
	t.Parallel()
	pub := &publishCounter{marks: []string{"POISON"}}
	pub.refusing.Store(true)
	h := newHarness(t, withReactor(pstest.ServerReactorOption{FuncName: "Publish", Reactor: pub}))
	ws := h.spaces["w1"]
	h.products("w1", 50)
	poison, err := ws.w.Create(h.ctx, "product", map[string]any{"title": "POISON"})
	require.NoError(t, err)
	h.products("w1", 49)

	code, body := h.wake("w1")
	require.Equal(t, http.StatusOK, code, body)
	h.settle()
	run := h.runs("w1")
	require.Equal(t, 99, run.count)
	require.Equal(t, 1, run.setAside)
	require.LessOrEqual(t, pub.requests.Load(), int64(2+7), "bisection, not one request per event")
	got := h.published("w1")
	require.Len(t, got, 99)
	for _, e := range got {
		require.NotEqual(t, poison, e.RecordKey)
	}
	require.Equal(t, 1, strings.Count(h.logs.String(), delivery.LogEventsSetAside), "logged once")
	require.Contains(t, h.logs.String(), `"reason":"rejected"`)

	// No drain, of this instance or another, sends it again within its backoff.
	other := h.instance()
	before := pub.requests.Load()
	for range 3 {
		code, body = h.wake("w1")
		require.Equal(t, http.StatusOK, code, body)
		code, body = h.wakeOn(other, "w1")
		require.Equal(t, http.StatusOK, code, body)
		h.settle()
	}
	require.Equal(t, 99, h.runs("w1").count, "nothing more published")
	require.Equal(t, before, pub.requests.Load(), "no request within the backoff")
	require.Equal(t, 1, strings.Count(h.logs.String(), delivery.LogEventsSetAside))
	require.EqualValues(t, 1, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"), "it stays pending")

	// The backoff passes: one request, alone; refused again, its backoff doubles.
	h.backoffPasses("w1")
	code, body = h.wakeOn(other, "w1")
	require.Equal(t, http.StatusOK, code, body)
	h.settle()
	require.Equal(t, 2, h.runs("w1").setAside)
	require.Equal(t, before+1, pub.requests.Load())
	require.Equal(t, 2, strings.Count(h.logs.String(), delivery.LogEventsSetAside))
	require.EqualValues(t, 1, h.count("w1", `SELECT count(*) FROM _ontology_replication_delivery
		WHERE accepted_at IS NULL AND next_verify_at = last_checked_at + interval '2 minutes'`))

	// Pub/Sub takes it now: after the backoff it is delivered.
	pub.refusing.Store(false)
	h.backoffPasses("w1")
	code, body = h.wake("w1")
	require.Equal(t, http.StatusOK, code, body)
	h.settle()
	require.Equal(t, 100, h.runs("w1").count)
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}

// silentPublish never answers a Publish RPC until released.
type silentPublish struct {
	rpcs     atomic.Int64
	released chan struct{}
}

func (s *silentPublish) React(req any) (bool, any, error) {
	if _, ok := req.(*pubsubpb.PublishRequest); !ok {
		return false, nil, nil
	}
	select {
	case <-s.released:
		return false, nil, nil // released: pstest answers
	default:
	}
	s.rpcs.Add(1)
	<-s.released
	return true, nil, status.Error(codes.Unavailable, "released")
}

// TestDrainPublishWithNoAnswer: Pub/Sub takes the request and never
// answers: the drainer gives up at its publish timeout, acknowledges
// nothing, and answers the wake-ups meanwhile 503; one request was sent
// until then, and once Pub/Sub answers again the drainer publishes the
// events with no other wake-up.
func TestDrainPublishWithNoAnswer(t *testing.T) {
	t.Parallel()
	silent := &silentPublish{released: make(chan struct{})}
	h := newHarness(t, withReactor(pstest.ServerReactorOption{FuncName: "Publish", Reactor: silent}))
	h.products("w1", 5)
	code, body := h.wake("w1")
	require.Equal(t, http.StatusOK, code, body)
	h.awaitLogged("no answer within 5s")
	require.EqualValues(t, 1, silent.rpcs.Load())
	code, body = h.wake("w1")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL"))
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"))
	close(silent.released) // pstest holds its lock while a reactor runs
	h.settle()
	require.Equal(t, 5, h.runs("w1").count, "the drainer publishes them once Pub/Sub answers")
}
