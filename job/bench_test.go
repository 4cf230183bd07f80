package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// benchSizes are the history sizes of the end-to-end benchmarks;
// REPLICATION_BENCH_SIZES (comma-separated) overrides them.
func benchSizes(b *testing.B) []int {
	raw := os.Getenv("REPLICATION_BENCH_SIZES")
	if raw == "" {
		return []int{1_000, 100_000, 1_000_000}
	}
	var out []int
	for _, f := range strings.Split(raw, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		require.NoError(b, err)
		out = append(out, n)
	}
	return out
}

// heapPeak samples the live heap while a run lasts and empties the Pub/Sub
// emulator's store of published messages as it goes (it keeps every message
// otherwise), so that the peak is the job's own, the emulator's in-flight
// requests included.
type heapPeak struct {
	stop chan struct{}
	done sync.WaitGroup
	peak uint64
}

func watchHeap(h *harness) *heapPeak {
	runtime.GC()
	p := &heapPeak{stop: make(chan struct{})}
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	p.done.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
			if i%10 == 0 {
				h.pubsub.ClearMessages()
			}
			metrics.Read(sample)
			p.peak = max(p.peak, sample[0].Value.Uint64())
		}
	})
	return p
}

func (p *heapPeak) end() float64 {
	close(p.stop)
	p.done.Wait()
	return float64(p.peak) / (1 << 20)
}

// BenchmarkJobBackfill runs `job backfill` end to end on a database upgraded
// from protocol 3 with n history rows, every one with a receipt (verified):
// the command enqueues them all with their state, page by page, and finds
// nothing to publish.
func BenchmarkJobBackfill(b *testing.B) {
	for _, n := range benchSizes(b) {
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) {
			h := newHarness(b, &sdkfixture.V3Template)
			s := h.spaces["w1"]
			g := h.start("w1")
			require.NoError(b, sdkfixture.BulkCreate(h.ctx, s.pool, sdkfixture.Demo, "product", "title", n, 1000))
			_, err := s.pool.Exec(h.ctx, `INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at, verified_at)
				SELECT $1::uuid, id, now(), now() FROM product_history WHERE replication IS NOT NULL`, g.Generation)
			require.NoError(b, err)
			require.NoError(b, sdkfixture.Upgrade(h.ctx, s.pool, sdkfixture.Demo))
			var elapsed time.Duration
			var peak float64
			for b.Loop() {
				b.StopTimer()
				for _, q := range []string{`DELETE FROM _ontology_replication_delivery`,
					`UPDATE _ontology_replication_targets SET backfill_complete = false, backfill_cursor = '{}', verified_count = 0`,
					`VACUUM ANALYZE`, `CHECKPOINT`} {
					_, err := s.pool.Exec(h.ctx, q)
					require.NoError(b, err)
				}
				w := watchHeap(h)
				b.StartTimer()
				started := time.Now()
				h.mustRun("backfill", "--workspace", "w1")
				elapsed += time.Since(started)
				peak = max(peak, w.end())
			}
			require.EqualValues(b, n, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NOT NULL"))
			b.ReportMetric(float64(n*b.N)/elapsed.Seconds(), "rows/s")
			b.ReportMetric(peak, "peak-heap-MB")
		})
	}
}

// BenchmarkJobReplay runs `job replay` end to end on a protocol-4 database
// with n delivered and verified events: every page resets 1,000 of them and
// the job's concurrent drains publish them all to the Pub/Sub emulator,
// 100 to a request, before the command returns.
func BenchmarkJobReplay(b *testing.B) {
	for _, n := range benchSizes(b) {
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) {
			h := newHarness(b, &sdkfixture.V4Template)
			s := h.spaces["w1"]
			h.start("w1")
			require.NoError(b, sdkfixture.BulkCreate(h.ctx, s.pool, sdkfixture.Demo, "product", "title", n, 50_000))
			var elapsed time.Duration
			var peak float64
			for b.Loop() {
				b.StopTimer()
				for _, q := range []string{`UPDATE _ontology_replication_delivery SET accepted_at = now(), verified_at = now()`,
					`INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at, verified_at)
					 SELECT generation, event_id, accepted_at, verified_at FROM _ontology_replication_delivery ON CONFLICT DO NOTHING`,
					`UPDATE _ontology_replication_targets SET verified_count = (SELECT count(*) FROM _ontology_replication_delivery)`,
					`VACUUM ANALYZE`, `CHECKPOINT`} {
					_, err := s.pool.Exec(h.ctx, q)
					require.NoError(b, err)
				}
				w := watchHeap(h)
				b.StartTimer()
				started := time.Now()
				h.mustRun("replay", "--workspace", "w1")
				elapsed += time.Since(started)
				peak = max(peak, w.end())
			}
			require.Zero(b, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"), "everything published")
			b.ReportMetric(float64(n*b.N)/elapsed.Seconds(), "rows/s")
			b.ReportMetric(peak, "peak-heap-MB")
		})
	}
}
