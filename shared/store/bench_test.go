package store_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// benchSizes are the retained-history sizes; REPLICATION_BENCH_SIZES
// (comma-separated) overrides them for a quick run.
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

func templateFor(protocol int) *pgtest.Template {
	if protocol == 3 {
		return &sdkfixture.V3Template
	}
	return &sdkfixture.V4Template
}

// historyEnv is a database at the protocol with an active generation and n
// retained, delivered and verified history rows.
func historyEnv(b testing.TB, protocol, n int) (*env, store.Target) {
	b.Helper()
	e := newEnv(b, templateFor(protocol))
	tg := e.start(b)
	started := time.Now()
	// Protocol 3 capture updates the singleton's revision once per event, so
	// large transactions pile up row versions: keep them small there.
	chunk := 50_000
	if protocol == 3 {
		chunk = 1_000
	}
	require.NoError(b, sdkfixture.BulkCreate(e.ctx, e.pool, sdkfixture.Demo, "product", "title", n, chunk))
	if protocol == 3 {
		e.exec(b, `INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at, verified_at)
			SELECT $1::uuid, id, now(), now() FROM product_history WHERE replication IS NOT NULL`, tg.Generation)
	} else {
		e.exec(b, `UPDATE _ontology_replication_delivery SET accepted_at = now(), verified_at = now()`)
		e.exec(b, `INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at, verified_at)
			SELECT generation, event_id, accepted_at, verified_at FROM _ontology_replication_delivery`)
		e.exec(b, `UPDATE _ontology_replication_targets SET verified_count = $1`, n)
	}
	// Vacuumed and checkpointed, so that neither autovacuum nor the
	// checkpointer is still busy with the build while the benchmark runs.
	e.exec(b, "VACUUM ANALYZE")
	e.exec(b, "CHECKPOINT")
	b.Logf("built %d history rows at protocol %d in %v", n, protocol, time.Since(started).Round(time.Millisecond))
	return e, tg
}

// BenchmarkPendingRead reads the next batch of 100 pending events behind n
// retained history rows: flat at protocol 4 (indexed queue), growing at
// protocol 3 (scan minus receipts).
func BenchmarkPendingRead(b *testing.B) {
	for _, protocol := range []int{4, 3} {
		for _, n := range benchSizes(b) {
			for _, read := range []string{"claim", "sdk"} {
				b.Run(fmt.Sprintf("protocol=%d/history=%d/%s", protocol, n, read), func(b *testing.B) {
					e, tg := historyEnv(b, protocol, n)
					require.NoError(b, sdkfixture.BulkCreate(e.ctx, e.pool, sdkfixture.Demo, "product", "title", 100, 100))
					for b.Loop() {
						var events int
						var err error
						if read == "claim" {
							// What the drain runs: the state, the target and the
							// claimed batch, released unpublished.
							var c *store.Claim
							if _, _, c, err = e.store.ClaimActive(e.ctx); err == nil {
								events = len(c.Events)
								c.Release(e.ctx)
							}
						} else {
							var batch store.Batch
							batch, err = e.store.PendingEvents(e.ctx, tg)
							events = len(batch.Events)
						}
						if err != nil || events != 100 {
							b.Fatalf("read %d events: %v", events, err)
						}
					}
				})
			}
		}
	}
}

// BenchmarkBackfill enqueues n protocol-3 history rows after the upgrade.
func BenchmarkBackfill(b *testing.B) {
	for _, n := range benchSizes(b) {
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) {
			e, _ := historyEnv(b, 3, n)
			require.NoError(b, sdkfixture.Upgrade(e.ctx, e.pool, sdkfixture.Demo))
			tg := e.target(b)
			var rows, pages int
			var elapsed time.Duration
			for b.Loop() {
				b.StopTimer()
				e.exec(b, `DELETE FROM _ontology_replication_delivery`)
				e.exec(b, `UPDATE _ontology_replication_targets SET backfill_complete = false, backfill_cursor = '{}', verified_count = 0`)
				e.exec(b, "VACUUM ANALYZE _ontology_replication_delivery")
				e.exec(b, "CHECKPOINT")
				b.StartTimer()
				started := time.Now()
				for {
					page, err := e.store.AdvanceBackfill(e.ctx, tg)
					require.NoError(b, err)
					rows += page.Rows
					pages++
					if page.Complete {
						break
					}
				}
				elapsed += time.Since(started)
			}
			b.ReportMetric(float64(rows)/elapsed.Seconds(), "rows/s")
			b.ReportMetric(float64(pages)/float64(b.N), "pages/op")
		})
	}
}

// BenchmarkReplay initialises a replay of n verified rows and advances it to
// the end.
func BenchmarkReplay(b *testing.B) {
	for _, n := range benchSizes(b) {
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) {
			e, tg := historyEnv(b, 4, n)
			var rows int
			var elapsed time.Duration
			for b.Loop() {
				b.StopTimer()
				e.exec(b, `UPDATE _ontology_replication_delivery SET accepted_at = now(), verified_at = now()`)
				e.exec(b, `INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at, verified_at)
					SELECT generation, event_id, accepted_at, verified_at FROM _ontology_replication_delivery ON CONFLICT DO NOTHING`)
				e.exec(b, `UPDATE _ontology_replication_targets SET verified_count = $1`, n)
				e.exec(b, "VACUUM ANALYZE")
				e.exec(b, "CHECKPOINT")
				b.StartTimer()
				started := time.Now()
				require.NoError(b, e.store.InitReplay(e.ctx, tg))
				for {
					page, err := e.store.AdvanceReplay(e.ctx, tg)
					require.NoError(b, err)
					rows += page.Rows
					if page.Complete {
						break
					}
				}
				elapsed += time.Since(started)
			}
			b.ReportMetric(float64(rows)/elapsed.Seconds(), "rows/s")
		})
	}
}

// BenchmarkInitReplay times replay initialisation alone: constant in the
// number of delivery rows.
func BenchmarkInitReplay(b *testing.B) {
	for _, n := range benchSizes(b) {
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) {
			e, tg := historyEnv(b, 4, n)
			for b.Loop() {
				require.NoError(b, e.store.InitReplay(e.ctx, tg))
			}
		})
	}
}
