package delivery_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTheEventsBehindAnEventThatFailsAloneFlow: an event larger than the
// SDK's byte bound comes in a batch of its own, and its publish fails
// alone (RESOURCE_EXHAUSTED, a message limit on the way: not an outage);
// the drainer keeps it claimed and claims the batch beside it at once, so
// the events behind it, and one committed later, are published while it
// waits for its backoff, and it is set aside after its third failure alone
// (TestAnEventThatFailsAloneIsSetAside has the counting).
func TestTheEventsBehindAnEventThatFailsAloneFlow(t *testing.T) {
	t.Parallel()
	limit := &sizeLimit{limit: 1 << 20}
	r := newRig(t, 2, withPublishReactor(limit))
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": strings.Repeat("x", 150_000)})
	require.NoError(t, err)
	r.growPastTheBound(t)
	r.commitBehind(t, 15)
	r.wakeOK(t, r.svc)
	r.awaitAccepted(t, 15) // the events behind it, while it waits for its backoff
	// The SDK commits on: Pub/Sub taking those tells the drainer that the
	// failure is the event's own, and it is set aside.
	later := r.commitUntilSetAside(t)
	r.settle(t)
	require.EqualValues(t, 15+later, r.acceptedCount(t), "every event but the one that fails is published")
	require.LessOrEqual(t, limit.failed.Load(), int64(3), "tried alone three times")
}

// awaitAccepted waits, a minute at most, until n events are accepted.
func (r *rig) awaitAccepted(t testing.TB, n int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for r.acceptedCount(t) < n {
		require.True(t, time.Now().Before(deadline), "fewer than %d events accepted after a minute", n)
		time.Sleep(5 * time.Millisecond) // the queue is the signal
	}
}

// growPastTheBound grows the SDK database's product events in place past
// the SDK's byte bound (2 MiB of payload, as the SDK's own size limit
// keeps its writes smaller): each then comes in a batch of its own.
func (r *rig) growPastTheBound(t testing.TB) {
	t.Helper()
	_, err := r.pool.Exec(r.ctx, `UPDATE product_history SET replication = jsonb_set(replication, '{payload}', to_jsonb(repeat('x', 2 << 20)))`)
	require.NoError(t, err)
}

// commitBehind commits n products, the events behind one that fails.
func (r *rig) commitBehind(t testing.TB, n int) {
	t.Helper()
	for range n {
		_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "behind it"})
		require.NoError(t, err)
	}
}

// commitUntilSetAside commits and wakes, as the SDK does, until an event
// is set aside (a minute at most), and returns how many it committed.
func (r *rig) commitUntilSetAside(t testing.TB) int64 {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for n := int64(1); ; n++ {
		_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "committed later", "stock": n})
		require.NoError(t, err)
		_, _ = r.wake(t, r.svc) // deferred while the drainer backs off: it carries the commit anyway
		st, err := r.svc.Status(r.ctx, "w1", "", 10)
		require.NoError(t, err)
		if st.SetAside.Count > 0 {
			require.EqualValues(t, 1, st.SetAside.Count, "%+v", st.SetAside)
			return n
		}
		require.True(t, time.Now().Before(deadline), "nothing set aside after a minute of commits")
		time.Sleep(20 * time.Millisecond) // the SDK's pace
	}
}
