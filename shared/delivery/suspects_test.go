package delivery_test

import (
	"strings"
	"sync/atomic"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/store"
)

// sizeLimit fails every Publish request that carries a message larger than
// limit bytes with RESOURCE_EXHAUSTED, as a gRPC server's message limit
// does (the Pub/Sub emulator's is 4 MiB): a failure that persists for one
// event and is not a refusal of its content. While down is set it fails
// every request with UNAVAILABLE (an outage).
type sizeLimit struct {
	limit int
	down  atomic.Bool
	// failed counts the requests it failed for their size, and
	// failedBeforeTaken those before it first let a request through.
	failed, failedBeforeTaken atomic.Int64
	taken                     atomic.Bool
}

// React implements pstest.Reactor.
func (l *sizeLimit) React(req any) (bool, any, error) {
	if l.down.Load() {
		return true, nil, status.Error(codes.Unavailable, "the service is currently unavailable")
	}
	for _, m := range req.(*pubsubpb.PublishRequest).Messages {
		if len(m.Data) > l.limit {
			l.failed.Add(1)
			if !l.taken.Load() {
				l.failedBeforeTaken.Add(1)
			}
			return true, nil, status.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", len(m.Data), l.limit)
		}
	}
	l.taken.Store(true)
	return false, nil, nil
}

// TestAnEventThatFailsAloneIsSetAside: one event whose publish fails the
// same way every time (not a refusal: RESOURCE_EXHAUSTED) does not block
// the events behind it; it is set aside with reason publish_failed and its
// code after suspectFailures failures of it alone while Pub/Sub took
// others, in the wake-ups' drain and in `job drain`'s bulk drain, and
// claims skip it after. Two shapes: an SDK event among others (a request of
// them fails, and it is then published alone), and an event larger than
// the SDK's byte bound, which comes in a batch of its own (its history row
// grown in place, as the SDK's size limit keeps its own writes smaller).
func TestAnEventThatFailsAloneIsSetAside(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		shape string
		// limit is the message limit; requests how many of its requests
		// fail at most before it is set aside (the first failure of a
		// request of several does not count against any one event).
		limit, requests int
	}{
		{"among others", 100_000, 4},
		{"a batch of its own", 1 << 20, 3},
	} {
		for _, path := range []string{"wake-ups", "bulk drain"} {
			t.Run(c.shape+"/"+path, func(t *testing.T) {
				t.Parallel()
				limit := &sizeLimit{limit: c.limit}
				r := newRig(t, 3, withPublishReactor(limit))
				_, err := r.w.Create(r.ctx, "product", map[string]any{"title": strings.Repeat("x", 150_000)})
				require.NoError(t, err)
				if c.limit > 150_000 {
					r.growPastTheBound(t)
				}
				r.commitBehind(t, 15)
				switch path {
				case "wake-ups":
					// Its drainer, meeting the failure (a transient code),
					// claims again after its backoff and tries the event
					// alone; the events behind it flow meanwhile, and the
					// SDK commits on, until Pub/Sub's taking those tells
					// that the failure is the event's own.
					r.wakeOK(t, r.svc)
					r.awaitAccepted(t, 15) // the events behind it flow
					r.commitUntilSetAside(t)
					r.settle(t)
				case "bulk drain":
					all, err := r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{})
					require.NoError(t, err)
					require.Equal(t, 1, all.SetAside)
				}
				// Tried alone three times once Pub/Sub took others: a
				// drain's publishes are in order, and until Pub/Sub takes
				// another (on a saturated machine, the probe beside it may
				// find no connection), the failures are no proof that they
				// are the event's own.
				failed, before := limit.failed.Load(), limit.failedBeforeTaken.Load()
				require.LessOrEqual(t, failed, max(int64(c.requests), before+1),
					"it was tried alone, three times (%d failures before Pub/Sub took a request)", before)

				st, err := r.svc.Status(r.ctx, "w1", "", 10)
				require.NoError(t, err)
				require.EqualValues(t, 1, st.SetAside.Count)
				ev := st.SetAside.Events[0]
				require.Equal(t, string(store.ReasonPublishFailed), ev.Reason)
				require.Contains(t, ev.Detail, "ResourceExhausted")
				require.Equal(t, 1, ev.Attempts)

				// Everything else is published, and claims skip it now.
				_, err = r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{})
				require.NoError(t, err)
				require.EqualValues(t, 1, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
				require.Equal(t, failed, limit.failed.Load())
			})
		}
	}
}

// TestAnOutageSetsNothingAside: while Pub/Sub answers UNAVAILABLE to every
// request, the drainer fails and backs off while the SDK commits on (its
// wake-ups deferred), and nothing is set aside; when it is back everything
// is delivered.
func TestAnOutageSetsNothingAside(t *testing.T) {
	t.Parallel()
	limit := &sizeLimit{limit: 1 << 30}
	r := newRig(t, 3, withPublishReactor(limit))
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": strings.Repeat("x", 150_000)})
	require.NoError(t, err)
	limit.down.Store(true)
	r.wakeOK(t, r.svc)
	deferred := 0
	for range 10 {
		_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "during the outage"})
		require.NoError(t, err)
		if _, err := r.wake(t, r.svc); err != nil {
			require.ErrorIs(t, err, delivery.ErrDrainRetrying)
			deferred++
		}
		st, err := r.svc.Status(r.ctx, "w1", "", 10)
		require.NoError(t, err)
		require.Zero(t, st.SetAside.Count)
	}
	t.Logf("%d of 10 wake-ups deferred during the outage", deferred)
	limit.down.Store(false)
	r.settle(t)
	r.requireEachAcknowledgedOnce(t, r.svc)
	st, err := r.svc.Status(r.ctx, "w1", "", 10)
	require.NoError(t, err)
	require.Zero(t, st.SetAside.Count)
}
