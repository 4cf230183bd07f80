package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/publish"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
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

// serverCPU is the CPU time the workspace's PostgreSQL server has used so
// far (pgtest.ServerCPU).
func (h *harness) serverCPU(tb testing.TB, id string) time.Duration {
	tb.Helper()
	cpu, err := pgtest.ServerCPU(h.ctx, func(ctx context.Context) (pid int, err error) {
		err = h.spaces[id].pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)
		return pid, err
	})
	require.NoError(tb, err)
	return cpu
}

// floorDrain drains w1 with sdkfixture.DrainWithFloor on workers
// connections of its own, and returns how many events it took: the floor's
// one statement per 100 events, or, with pub, the two transactions with the
// batch's messages (event.AppendMessage) published between as one Publish
// RPC of pub to w1's topic, the least that does the drain's whole work.
func (h *harness) floorDrain(tb testing.TB, g sdkfixture.Generation, workers int, pub *publish.Publisher) int64 {
	tb.Helper()
	var publishBatch func(ids []string, events [][]byte) error
	if pub != nil {
		publishBatch = func(ids []string, events [][]byte) error {
			messages := make([][]byte, len(ids))
			for i, raw := range events {
				js, _, err := event.AppendMessage(make([]byte, 0, len(raw)+128), raw, g.SourceID, ids[i], g.Generation)
				if err != nil {
					return err
				}
				messages[i] = js
			}
			_, err := pub.Publish(h.ctx, "projects/p1/topics/events-w1", messages)
			return err
		}
	}
	var taken atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			conn, err := h.spaces["w1"].pool.Acquire(h.ctx)
			if !assert.NoError(tb, err) {
				return
			}
			defer conn.Release()
			n, err := sdkfixture.DrainWithFloor(h.ctx, conn.Conn(), g.Generation, publishBatch)
			assert.NoError(tb, err)
			taken.Add(n)
		})
	}
	wg.Wait()
	return taken.Load()
}

// BenchmarkJobCost runs `job drain` and `job replay` end to end on 20,000
// events of 1 KB (PostgreSQL → the command → the Pub/Sub emulator), each
// beside its floors on the same database, in every iteration, in an order
// that turns with the iteration, so that the machine's drift falls on the
// command and its floors alike. The floors, for the replay after
// sdkfixture.FloorReplayPage pages (one statement a page):
//
//   - floor: sdkfixture.FloorDrain, one statement per 100 events that
//     claims, reads and accepts them, on the job's default pool of
//     connections (4), as the job's drains ran when the issue set the bar;
//   - floor-1: the same on one connection, the least CPU: no two of its
//     statements ever contend;
//   - floor-publish: the least that does a drain's whole work, on one
//     connection: sdkfixture.FloorClaim, the batch encoded and published to
//     the same emulator as one request, then sdkfixture.FloorAccept (on
//     more connections its claims, which end before the publish, would
//     take the same events: 33,702 taken of 20,000 on 4).
//
// FloorDrain publishes nothing between reading and accepting, so no drain
// can match it; floor-publish cannot hold a batch's events against other
// drains while it publishes them, as the product must. It reports, for
// each, the server's CPU per 1,000 events (pgtest.ServerCPU) and the rate;
// for the command, the sessions it opened as the server counts them
// (pg_stat_database.sessions), and its ratios to each floor: the median of
// the iterations' ratios of CPU, and the ratio of the rates. (ns/op is one
// iteration: the command, its floors and the resets before each.)
func BenchmarkJobCost(b *testing.B) {
	const events = 20_000
	for _, command := range []string{"drain", "replay"} {
		b.Run(command, func(b *testing.B) {
			kinds := []string{"job", "floor", "floor-1", "floor-publish"}
			if command == "replay" {
				// floor-publish after the replay's floor pages cost three
				// times the drain's and ran at half its rate: a figure not
				// understood is not reported.
				kinds = kinds[:3]
			}
			h := newHarness(b, &sdkfixture.V4Template)
			s := h.spaces["w1"]
			g := h.start("w1")
			publisher, err := publish.New(h.ctx, publish.Config{EmulatorHost: h.pubsub.Addr})
			require.NoError(b, err)
			b.Cleanup(func() { _ = publisher.Close() })
			require.NoError(b, sdkfixture.BulkCreate(h.ctx, s.pool, sdkfixture.Demo, "product", "title", events, 50_000))
			require.NoError(b, sdkfixture.PadPayloads(h.ctx, s.pool, 800))
			total := h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery")
			// Autovacuum would run whenever its schedule says, in one
			// kind's measurement and not another's: off for these tables,
			// which each run vacuums before it starts.
			for _, table := range []string{"_ontology_replication_delivery", "_ontology_replication_receipts", "_ontology_replication_targets"} {
				_, err := s.pool.Exec(h.ctx, `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`)
				require.NoError(b, err)
			}
			prepare := []string{`UPDATE _ontology_replication_delivery SET accepted_at = NULL, verified_at = NULL, next_verify_at = now(), last_checked_at = NULL`,
				`DELETE FROM _ontology_replication_receipts`, `UPDATE _ontology_replication_targets SET verified_count = 0`}
			if command == "replay" {
				prepare = []string{`UPDATE _ontology_replication_delivery SET accepted_at = now(), verified_at = now()`,
					`INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at, verified_at)
					 SELECT generation, event_id, accepted_at, verified_at FROM _ontology_replication_delivery ON CONFLICT DO NOTHING`,
					`UPDATE _ontology_replication_targets SET verified_count = (SELECT count(*) FROM _ontology_replication_delivery)`}
			}
			runKind := func(kind string) {
				switch {
				case kind == "job":
					h.mustRun(command, "--workspace", "w1")
				case command == "replay":
					var cursor *string
					for {
						var last *string
						var n int64
						require.NoError(b, s.pool.QueryRow(h.ctx, sdkfixture.FloorReplayPage, g.Generation, cursor).Scan(&last, &n))
						if n < 1000 {
							break
						}
						cursor = last
					}
					fallthrough
				default:
					workers, pub := defaultPoolSize, (*publish.Publisher)(nil)
					switch kind {
					case "floor-1":
						workers = 1
					case "floor-publish":
						workers, pub = 1, publisher
					}
					require.EqualValues(b, total, h.floorDrain(b, g, workers, pub))
				}
			}
			elapsed := map[string]time.Duration{}
			cpu := map[string][]time.Duration{}
			var sessions int64
			i := 0
			for b.Loop() {
				b.StopTimer()
				for k := range kinds {
					kind := kinds[(i+k)%len(kinds)]
					for _, q := range append(prepare, `VACUUM ANALYZE`, `CHECKPOINT`) {
						_, err := s.pool.Exec(h.ctx, q)
						require.NoError(b, err)
					}
					h.pubsub.ClearMessages()
					opened := h.sessionsOpened(b, "w1")
					cpuBefore := h.serverCPU(b, "w1")
					b.StartTimer()
					started := time.Now()
					runKind(kind)
					elapsed[kind] += time.Since(started)
					b.StopTimer()
					// The command's sessions have ended (their CPU time is
					// the postmaster's once they exit).
					require.Eventually(b, func() bool {
						return h.count("w1", `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ontology-replication'`) == 0
					}, time.Minute, time.Millisecond)
					cpu[kind] = append(cpu[kind], h.serverCPU(b, "w1")-cpuBefore)
					if kind == "job" {
						sessions += opened()
					}
					require.Zero(b, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"), "%s published everything", kind)
				}
				i++
				b.StartTimer()
			}
			n := float64(total) * float64(b.N)
			for _, kind := range kinds {
				var sum time.Duration
				for _, c := range cpu[kind] {
					sum += c
				}
				b.ReportMetric(n/elapsed[kind].Seconds(), kind+"-events/s")
				b.ReportMetric(sum.Seconds()*1000/n*1000, kind+"-pg-cpu-ms/1000events")
			}
			for _, floor := range kinds[1:] {
				ratios := make([]float64, b.N)
				for it := range ratios {
					ratios[it] = float64(cpu["job"][it]) / float64(cpu[floor][it])
				}
				slices.Sort(ratios)
				b.ReportMetric(ratios[len(ratios)/2], "job/"+floor)
				b.ReportMetric(elapsed[floor].Seconds()/elapsed["job"].Seconds(), "job/"+floor+"-rate")
			}
			b.ReportMetric(float64(sessions)/float64(b.N), "sessions/command")
		})
	}
}
