package delivery_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// payloadKB writes n products whose captured events carry about 1 KB of
// payload each.
func (r *rig) payloadKB(tb testing.TB, n int) {
	tb.Helper()
	require.NoError(tb, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", n, 50_000))
	require.NoError(tb, sdkfixture.PadPayloads(r.ctx, r.pool, 800))
}

// serverCPU is the CPU time the PostgreSQL server has used so far
// (pgtest.ServerCPU).
func serverCPU(tb testing.TB, r *rig) time.Duration {
	tb.Helper()
	cpu, err := pgtest.ServerCPU(r.ctx, func(ctx context.Context) (pid int, err error) {
		err = r.pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)
		return pid, err
	})
	require.NoError(tb, err)
	return cpu
}

// resetQueue makes every event pending again, as it was before the first
// drain, and vacuums, outside the timed part.
func (r *rig) resetQueue(tb testing.TB) {
	tb.Helper()
	for _, q := range []string{
		`UPDATE _ontology_replication_delivery SET accepted_at = NULL, verified_at = NULL, next_verify_at = now(), last_checked_at = NULL`,
		`DELETE FROM _ontology_replication_receipts`,
		`VACUUM ANALYZE _ontology_replication_delivery, _ontology_replication_receipts`,
	} {
		_, err := r.pool.Exec(r.ctx, q)
		require.NoError(tb, err)
	}
	r.srv.ClearMessages()
}

// sqlFloorDrain is the least SQL that can drain a batch
// (sdkfixture.FloorDrain); the drain's PostgreSQL cost is judged against it.
const sqlFloorDrain = sdkfixture.FloorDrain

// BenchmarkDrain measures the drain end to end, PostgreSQL to the Pub/Sub
// emulator, with 1 KB payloads: one wake-up of each of 1 and 4 instances
// (each its own drainer, with Config.BatchesOut batches out, claiming on
// its own: one wake-up is a quiet workspace), and the floor
// (sqlFloorDrain, on as many connections) in the same run: events/s,
// allocations and the server's CPU per 1,000 events, whose ratio to the
// floor's is the drain's overhead in PostgreSQL.
func BenchmarkDrain(b *testing.B) {
	const events = 20_000
	for _, workers := range []int{1, 4} {
		for _, kind := range []string{"drain", "floor"} {
			b.Run(fmt.Sprintf("%s/instances=%d", kind, workers), func(b *testing.B) {
				r := newRig(b, 2)
				instances := []*delivery.Service{r.svc}
				for len(instances) < workers {
					instances = append(instances, r.newService())
				}
				r.payloadKB(b, events)
				var published atomic.Int64
				var elapsed, cpu time.Duration
				var allocs, bytes uint64
				for b.Loop() {
					b.StopTimer()
					r.resetQueue(b)
					var before, after runtime.MemStats
					runtime.ReadMemStats(&before)
					cpuBefore := serverCPU(b, r)
					b.StartTimer()
					started := time.Now()
					if kind == "drain" {
						for _, svc := range instances {
							r.wakeOK(b, svc)
						}
						r.settle(b, instances...)
						published.Add(r.acceptedCount(b))
					} else {
						var wg sync.WaitGroup
						for range workers {
							wg.Go(func() {
								for {
									n, err := r.floorOnce()
									if err != nil {
										b.Error(err)
										return
									}
									published.Add(int64(n))
									if n == 0 {
										return
									}
								}
							})
						}
						wg.Wait()
					}
					elapsed += time.Since(started)
					b.StopTimer()
					cpu += serverCPU(b, r) - cpuBefore
					runtime.ReadMemStats(&after)
					allocs += after.Mallocs - before.Mallocs
					bytes += after.TotalAlloc - before.TotalAlloc
					b.StartTimer()
				}
				n := float64(published.Load())
				b.ReportMetric(n/elapsed.Seconds(), "events/s")
				b.ReportMetric(cpu.Seconds()*1000/n*1000, "pg-cpu-ms/1000events")
				if kind == "drain" {
					b.ReportMetric(float64(allocs)/n, "allocs/event")
					b.ReportMetric(float64(bytes)/n, "B/event")
				}
			})
		}
	}
}

// floorOnce drains one batch with the floor's one statement, and returns
// how many events it took.
func (r *rig) floorOnce() (int, error) {
	rows, err := r.pool.Query(r.ctx, sqlFloorDrain, r.gen.Generation)
	if err != nil {
		return 0, err
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	return n, rows.Err()
}

// BenchmarkDrainRoundTrips counts the SQL round trips of a batch: a quiet
// wake-up's drainer's (its claim, then its acknowledgement), a drainer's
// through a backlog, and the bulk drain's (DrainAll, four batches out:
// one round trip acknowledges the ended ones and claims the next).
func BenchmarkDrainRoundTrips(b *testing.B) {
	b.Run("quiet", func(b *testing.B) {
		r := newRig(b, 2)
		var trips int64
		for b.Loop() {
			b.StopTimer()
			_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "one commit, one wake-up"})
			require.NoError(b, err)
			before := r.queries.n.Load()
			b.StartTimer()
			r.wakeOK(b, r.svc)
			r.settle(b)
			trips += r.queries.n.Load() - before
		}
		b.ReportMetric(float64(trips)/float64(b.N), "roundtrips/batch")
	})
	b.Run("drainer", func(b *testing.B) {
		r := newRig(b, 2)
		r.payloadKB(b, 20_000)
		var trips, batches int64
		for b.Loop() {
			b.StopTimer()
			r.resetQueue(b)
			before := r.queries.n.Load()
			b.StartTimer()
			r.wakeOK(b, r.svc)
			r.settle(b)
			require.EqualValues(b, 20_000, r.acceptedCount(b))
			trips += r.queries.n.Load() - before
			batches += 200
		}
		b.ReportMetric(float64(trips)/float64(batches), "roundtrips/batch")
	})
	b.Run("bulk", func(b *testing.B) {
		r := newRig(b, 2)
		r.payloadKB(b, 20_000)
		var trips, batches int64
		for b.Loop() {
			b.StopTimer()
			r.resetQueue(b)
			before := r.queries.n.Load()
			b.StartTimer()
			res, err := r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{Drains: 4})
			require.NoError(b, err)
			require.Equal(b, 20_000, res.Published)
			trips += r.queries.n.Load() - before
			batches += 200
		}
		b.ReportMetric(float64(trips)/float64(batches), "roundtrips/batch")
	})
}

// TestDrainHeapIsBoundedByTheBatch drains one batch (the drain's, on a
// claim of its own: a wake-up goes on while more are pending) from a
// backlog of
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
	// The process-wide allocation of one drained batch, the least of eight
	// (other goroutines of the process allocate too: on a busy machine a
	// batch's window meets more of their work).
	heap := func(r *rig, n int) uint64 {
		r.payloadKB(t, n)
		_, err := r.svc.Sweep(r.ctx, "w1", 1) // warm: pools, prepared statements
		require.NoError(t, err)
		least := uint64(1 << 62)
		for range 8 {
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			published, err := r.svc.Sweep(r.ctx, "w1", 1) // the drain's one batch
			require.NoError(t, err)
			require.Equal(t, 100, published)
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

// slowPublish delays every Publish request: a slow Pub/Sub.
type slowPublish time.Duration

func (d slowPublish) React(any) (bool, any, error) {
	time.Sleep(time.Duration(d))
	return false, nil, nil
}

// BenchmarkWriterLatency measures an SDK writer's transaction (one product
// created through beginReplicationWrite) while lifecycle operations (the
// lifecycle lock taken exclusively, as pause and replay start do) arrive
// every 100 ms: with no drain, and with 4 instances' drainers, woken
// continually, whose publishes take 200 ms each. It reports the writer's
// p50 and p99.
func BenchmarkWriterLatency(b *testing.B) {
	for _, drains := range []int{0, 4} {
		b.Run(fmt.Sprintf("drains=%d", drains), func(b *testing.B) {
			r := newRig(b, 2, withPublishReactor(slowPublish(200*time.Millisecond)))
			ctx, cancel := context.WithCancel(r.ctx)
			var wg sync.WaitGroup
			for range drains {
				svc := r.newService()
				wg.Go(func() { // an instance woken after every commit
					for ctx.Err() == nil {
						_, _ = r.wake(b, svc)
						select {
						case <-ctx.Done():
						case <-time.After(time.Millisecond):
						}
					}
				})
			}
			wg.Go(func() { // lifecycle operations
				for ctx.Err() == nil {
					tx, err := r.pool.Begin(ctx)
					if err != nil {
						return
					}
					_, _ = tx.Exec(ctx, "SELECT id FROM _ontology_replication WHERE id FOR UPDATE")
					_, _ = tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", sdkfixture.LifecycleLock)
					_ = tx.Commit(ctx)
					select {
					case <-ctx.Done():
					case <-time.After(100 * time.Millisecond):
					}
				}
			})
			var latencies []time.Duration
			for b.Loop() {
				started := time.Now()
				_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "written by the SDK"})
				require.NoError(b, err)
				latencies = append(latencies, time.Since(started))
			}
			cancel()
			wg.Wait()
			slices.Sort(latencies)
			at := func(q float64) float64 {
				return float64(latencies[min(int(q*float64(len(latencies))), len(latencies)-1)].Microseconds())
			}
			b.ReportMetric(at(0.50), "p50-µs")
			b.ReportMetric(at(0.99), "p99-µs")
		})
	}
}
