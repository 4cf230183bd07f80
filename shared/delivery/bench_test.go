package delivery_test

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// payloadKB writes n products whose captured events carry about 1 KB of
// payload each.
func (r *rig) payloadKB(tb testing.TB, n int) {
	tb.Helper()
	require.NoError(tb, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", n, 50_000))
	_, err := r.pool.Exec(r.ctx, `UPDATE product_history SET replication = jsonb_set(replication, '{payload}',
		to_jsonb(((replication->>'payload')::jsonb || jsonb_build_object('note', repeat('x', 800)))::text))`)
	require.NoError(tb, err)
	_, err = r.pool.Exec(r.ctx, "VACUUM ANALYZE")
	require.NoError(tb, err)
}

// BenchmarkDrain measures the drain end to end, PostgreSQL to the Pub/Sub
// emulator, with 1 KB payloads, for 1 and 4 concurrent invocations.
func BenchmarkDrain(b *testing.B) {
	for _, workers := range []int{1, 4} {
		b.Run(fmt.Sprintf("invocations=%d", workers), func(b *testing.B) {
			r := newRig(b, workers+1)
			const events = 20_000
			var published atomic.Int64
			var elapsed time.Duration
			var allocs, bytes uint64
			for b.Loop() {
				b.StopTimer()
				_, err := r.pool.Exec(r.ctx, `UPDATE _ontology_replication_delivery SET accepted_at = NULL`)
				require.NoError(b, err)
				if published.Load() == 0 {
					r.payloadKB(b, events)
				}
				r.srv.ClearMessages()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				b.StartTimer()
				started := time.Now()
				var wg sync.WaitGroup
				for range workers {
					wg.Go(func() {
						for {
							res, err := r.svc.Drain(r.ctx, "w1")
							if err != nil {
								b.Error(err)
								return
							}
							published.Add(int64(res.Published))
							if res.Published == 0 {
								return
							}
						}
					})
				}
				wg.Wait()
				elapsed += time.Since(started)
				runtime.ReadMemStats(&after)
				allocs += after.Mallocs - before.Mallocs
				bytes += after.TotalAlloc - before.TotalAlloc
			}
			n := float64(published.Load())
			b.ReportMetric(n/elapsed.Seconds(), "events/s")
			b.ReportMetric(float64(allocs)/n, "allocs/event")
			b.ReportMetric(float64(bytes)/n, "B/event")
		})
	}
}

// BenchmarkDrainRoundTrips counts the SQL round trips of one batch.
func BenchmarkDrainRoundTrips(b *testing.B) {
	r := newRig(b, 2)
	r.payloadKB(b, 100*1000)
	before := r.queries.n.Load()
	for b.Loop() {
		res, err := r.svc.Drain(r.ctx, "w1")
		require.NoError(b, err)
		require.Equal(b, 100, res.Published)
	}
	b.ReportMetric(float64(r.queries.n.Load()-before)/float64(b.N), "roundtrips/batch")
}

// TestDrainHeapIsBoundedByTheBatch drains one batch from a backlog of
// REPLICATION_BACKLOG (default 10⁵; 10⁶ for the figure in the README)
// pending events and reports the heap the invocation added.
func TestDrainHeapIsBoundedByTheBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a large backlog")
	}
	backlog := 100_000
	if raw := os.Getenv("REPLICATION_BACKLOG"); raw != "" {
		backlog, _ = strconv.Atoi(raw)
	}
	// The process-wide allocation of one drained batch, the least of five
	// (other goroutines of the process allocate too).
	heap := func(r *rig, n int) uint64 {
		r.payloadKB(t, n)
		_, err := r.svc.Drain(r.ctx, "w1") // warm: pools, prepared statements
		require.NoError(t, err)
		least := uint64(1 << 62)
		for range 5 {
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			res, err := r.svc.Drain(r.ctx, "w1")
			require.NoError(t, err)
			require.Equal(t, 100, res.Published)
			runtime.ReadMemStats(&after)
			least = min(least, after.TotalAlloc-before.TotalAlloc)
		}
		return least
	}
	small := heap(newRig(t, 2), 1_000)
	large := heap(newRig(t, 2), backlog)
	t.Logf("allocated per batch: %d B with 10^3 pending, %d B with %d pending", small, large, backlog)
	require.Less(t, float64(large), 2*float64(small), "one batch's memory does not grow with the backlog")
}

// BenchmarkVerify measures verification rounds of 1,000 through the real
// BigQuery client and the in-test server.
func BenchmarkVerify(b *testing.B) {
	r := newRig(b, 2)
	const events = 20_000
	r.payloadKB(b, events)
	var verified int
	var elapsed time.Duration
	var lookups int64
	for b.Loop() {
		b.StopTimer()
		_, err := r.pool.Exec(r.ctx, `UPDATE _ontology_replication_delivery SET accepted_at = now(), next_verify_at = now(), verified_at = NULL`)
		require.NoError(b, err)
		_, err = r.pool.Exec(r.ctx, `UPDATE _ontology_replication_targets SET verified_count = 0`)
		require.NoError(b, err)
		before := r.bq.Queries()
		qBefore := r.queries.n.Load()
		b.StartTimer()
		started := time.Now()
		res, err := r.svc.Verify(r.ctx, "w1")
		elapsed += time.Since(started)
		b.StopTimer()
		require.NoError(b, err)
		verified += res.Verified
		lookups += r.bq.Queries() - before
		b.ReportMetric(float64(r.queries.n.Load()-qBefore)/float64(res.Rounds), "roundtrips/round")
		b.StartTimer()
	}
	b.ReportMetric(float64(verified)/elapsed.Seconds(), "verified/s")
	b.ReportMetric(float64(lookups)*1000/float64(verified), "lookups/1000")
}
