package store_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// requireConsistent checks that every delivery row's acceptance matches its
// receipt and that verified_count equals the verified rows.
func requireConsistent(t *testing.T, e *env) {
	t.Helper()
	require.Zero(t, e.count(t, `SELECT count(*) FROM _ontology_replication_delivery d FULL JOIN _ontology_replication_receipts r USING (generation, event_id)
		WHERE d.event_id IS NULL OR (d.accepted_at IS NULL) <> (r.event_id IS NULL)`), "acceptance and receipts agree")
	require.Zero(t, e.count(t, `SELECT count(*) FROM _ontology_replication_targets t
		WHERE verified_count <> (SELECT count(*) FROM _ontology_replication_delivery d WHERE d.generation = t.generation AND verified_at IS NOT NULL)`))
}

func TestConcurrentAcknowledgersOfOverlappingIDs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	for round := range 5 {
		e.products(t, 100)
		b, err := e.store.PendingEvents(e.ctx, tg)
		require.NoError(t, err)
		ids := b.IDs()
		require.Len(t, ids, 100, "round %d", round)
		var wg sync.WaitGroup
		start := make(chan struct{})
		var receipts atomic.Int64
		for _, part := range [][]string{ids[:70], ids[30:]} {
			wg.Go(func() {
				<-start
				n, err := e.store.Acknowledge(e.ctx, tg, part)
				assert.NoError(t, err)
				receipts.Add(n)
			})
		}
		close(start)
		wg.Wait()
		require.EqualValues(t, 100, receipts.Load(), "each event acknowledged exactly once")
	}
	require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
	requireConsistent(t, e)
}

// TestConcurrentClaimsAreDisjoint: workers on separate connections claim and
// acknowledge until the queue is empty; the union of their batches is the
// queue, with no event twice.
func TestConcurrentClaimsAreDisjoint(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.productsBulk(t, 1000)
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				c, err := e.store.Claim(e.ctx, tg)
				if !assert.NoError(t, err) || len(c.Events) == 0 {
					return
				}
				mu.Lock()
				for _, id := range c.IDs() {
					seen[id]++
				}
				mu.Unlock()
				_, err = c.Acknowledge(e.ctx)
				if !assert.NoError(t, err) {
					return
				}
			}
		})
	}
	wg.Wait()
	require.Len(t, seen, 1000)
	for id, n := range seen {
		require.Equal(t, 1, n, "event %s claimed %d times", id, n)
	}
	requireConsistent(t, e)
}

// TestAcknowledgementRacesReplayAndWriters runs drains, SDK writers and
// replays at once: no deadlock, no lost state, and in the end every event
// (including those written during the replays) is accepted.
func TestAcknowledgementRacesReplayAndWriters(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.productsBulk(t, 2000)
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var acked, replays, writes atomic.Int64
	for range 3 { // drains
		wg.Go(func() {
			for ctx.Err() == nil {
				c, err := e.store.Claim(e.ctx, tg)
				if !assert.NoError(t, err) {
					return
				}
				n, err := c.Acknowledge(e.ctx)
				if !assert.NoError(t, err) {
					return
				}
				acked.Add(n)
			}
		})
	}
	wg.Go(func() { // writer
		for ctx.Err() == nil {
			_, err := e.w.Create(e.ctx, "product", map[string]any{"title": "during"})
			if !assert.NoError(t, err) {
				return
			}
			writes.Add(1)
		}
	})
	wg.Go(func() { // replays
		for ctx.Err() == nil {
			if !assert.NoError(t, e.store.InitReplay(e.ctx, tg)) {
				return
			}
			for {
				page, err := e.store.AdvanceReplay(e.ctx, tg)
				if !assert.NoError(t, err) {
					return
				}
				if page.Complete {
					break
				}
			}
			replays.Add(1)
		}
	})
	wg.Wait()
	require.Positive(t, replays.Load())
	require.Positive(t, writes.Load())
	require.Positive(t, acked.Load())
	e.drainAll(t, tg)
	require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
	require.EqualValues(t, 2000+writes.Load(), e.count(t, "SELECT count(*) FROM _ontology_replication_delivery"))
	requireConsistent(t, e)
	tg = e.target(t)
	require.True(t, tg.ReplayComplete)
	t.Logf("%d acknowledgements, %d replays, %d writes", acked.Load(), replays.Load(), writes.Load())
}
