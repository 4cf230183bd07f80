package delivery_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/store"
)

// sessionCutter is a sizeLimit that, when it fails a request for the
// at-th time, first ends the sessions that hold claim locks (and waits
// until they are gone): the batch then cannot be finished on its session.
type sessionCutter struct {
	*sizeLimit
	at   int64
	pool *pgxpool.Pool // the SDK database's; set before the first publish

	mu  sync.Mutex
	cut int64
	err error
}

// React implements pstest.Reactor.
func (c *sessionCutter) React(req any) (bool, any, error) {
	before := c.failed.Load()
	handled, resp, err := c.sizeLimit.React(req)
	if c.failed.Load() == c.at && before < c.at {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.err = c.pool.QueryRow(context.Background(), `SELECT count(*) FROM (SELECT pg_terminate_backend(pid, 10000) FROM pg_locks
			WHERE locktype = 'advisory' AND objsubid = 2 AND granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())) cut`).Scan(&c.cut)
	}
	return handled, resp, err
}

// TestASetAsideLostWithItsSessionIsNotPublishedAgain: an event's third
// failure alone sets it aside, but the session its batch was claimed on
// ends before the batch is finished, so the set-aside is not written and
// the event is pending again. The drain sets it aside at its next claim on
// the same evidence, without a fourth publish of it (before, the lost
// decision was forgotten and the event was tried three times more). Once
// the set-aside is written, the decision is forgotten: a retry publishes.
func TestASetAsideLostWithItsSessionIsNotPublishedAgain(t *testing.T) {
	t.Parallel()
	cutter := &sessionCutter{sizeLimit: &sizeLimit{limit: 1 << 20}, at: 3}
	r := newRig(t, 3, withPublishReactor(cutter))
	cutter.pool = r.pool
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "grown in place"})
	require.NoError(t, err)
	r.growPastTheBound(t)
	r.commitBehind(t, 5)

	var drains []string
	for attempt := 0; ; attempt++ {
		require.Less(t, attempt, 10, "set aside within ten drains: %v", drains)
		res, err := r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{})
		drains = append(drains, fmt.Sprintf("%+v %v", res, err))
		st, serr := r.svc.Status(r.ctx, "w1", "", 10)
		require.NoError(t, serr)
		if st.SetAside.Count > 0 {
			require.EqualValues(t, 1, st.SetAside.Count)
			require.Equal(t, string(store.ReasonPublishFailed), st.SetAside.Events[0].Reason)
			require.Contains(t, st.SetAside.Events[0].Detail, "every publish of it alone failed with ResourceExhausted")
			break
		}
	}
	cutter.mu.Lock()
	require.NoError(t, cutter.err)
	require.Positive(t, cutter.cut, "the claim's session was ended at the third failure")
	cutter.mu.Unlock()
	require.EqualValues(t, 3, cutter.failed.Load(), "published alone three times, not again after its set-aside was lost")
	_, err = r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{})
	require.NoError(t, err)
	require.EqualValues(t, 1, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))

	// Once written, the decision is done with: an operator's retry (the
	// limit raised) publishes the event.
	cutter.limit = 8 << 20
	_, err = r.svc.SetAsideEvents(r.ctx, "w1", 10, true)
	require.NoError(t, err)
	_, err = r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{})
	require.NoError(t, err)
	require.Zero(t, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"), "the retried event published")
}
