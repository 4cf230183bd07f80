package functions

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
)

// BenchmarkWakeUps drives the wake-up path as the SDK does, on one
// workspace: 8 SDK writers commit at REPLICATION_WAKEUP_RATES commits a
// second in all (default 150), each awaiting its commit's wake-up (HTTP,
// the runtime token, the SDK's 5 s) before its next commit, to one of 4
// instances of the drain, with Pub/Sub answering at once (pubsub=fast) and
// with every Publish held 1 s (pubsub=slow), for REPLICATION_WAKEUP_SECONDS
// (default 10) after a 2 s warm-up at the rate that is not measured. Beside
// it, the floor: no wake-up; each commit drained on a warm connection with
// the least SQL that can publish between claiming and accepting (claim and
// read, then lock and accept), off the writer's path. It reports the
// answers (p50, p99, max, and those not 2xx), the writers' achieved rate,
// commit → accepted (p50, p99), and from the server's own counters the
// drain's PostgreSQL CPU a commit against the writers' and the floor's
// (backends by application_name from /proc, and the CPU of sessions that
// ended between samples), its statements a commit (pg_stat_statements) and
// the sessions it opened. Run with
//
//	go test -run='^$' -bench='^BenchmarkWakeUps$' -benchtime=1x -timeout=60m ./functions/
func BenchmarkWakeUps(b *testing.B) {
	seconds := benchEnvInt(b, "REPLICATION_WAKEUP_SECONDS", 10)
	for _, rate := range benchRates(b, "REPLICATION_WAKEUP_RATES", "150") {
		for _, pubsub := range []string{"fast", "slow"} {
			b.Run(fmt.Sprintf("rate=%d/pubsub=%s", rate, pubsub), func(b *testing.B) {
				wb := newWakeBench(b, wakeBenchConfig{workspaces: 1, floor: true})
				if pubsub == "slow" {
					wb.delay.Store(int64(time.Second))
				}
				runWakeLoad(b, wb, rate, time.Duration(seconds)*time.Second, false, true)
			})
		}
	}
}

// BenchmarkWakeUpsFleet drives the wake-up path as the SDK does (see
// BenchmarkWakeUps) over a fleet: REPLICATION_FLEET_SIZES workspace
// databases on one PostgreSQL server (default 1,50,200,1000), the
// workspaces picked uniformly or Zipf-skewed, 150 commits a second in all
// (REPLICATION_WAKEUP_RATES), each commit's wake-up to one of 4 instances
// of the drain, which reach the server directly or through a PgBouncer in
// session mode (pooled: the deployment the README recommends for a fleet).
// Beside the figures of BenchmarkWakeUps it reports the peak of the drain
// role's server sessions. Setting up 1,000 databases takes minutes: run
// the sizes you need, -bench='WakeUpsFleet/workspaces=200/'.
func BenchmarkWakeUpsFleet(b *testing.B) {
	seconds := benchEnvInt(b, "REPLICATION_WAKEUP_SECONDS", 10)
	sizes := benchRates(b, "REPLICATION_FLEET_SIZES", "1,50,200,1000")
	for _, n := range sizes {
		for _, mode := range []string{"direct", "pooled"} {
			for _, skew := range []string{"uniform", "zipf"} {
				b.Run(fmt.Sprintf("workspaces=%d/%s/%s", n, mode, skew), func(b *testing.B) {
					wb := newWakeBench(b, wakeBenchConfig{workspaces: n, pooled: mode == "pooled", floor: n <= 50})
					for _, rate := range benchRates(b, "REPLICATION_WAKEUP_RATES", "150") {
						runWakeLoad(b, wb, rate, time.Duration(seconds)*time.Second, skew == "zipf", n <= 50)
					}
				})
			}
		}
	}
}

// runWakeLoad warms the bench up at rate for 2 s, then measures d at the
// rate (and, with floor, the floor's d after it), and reports.
func runWakeLoad(b *testing.B, wb *wakeBench, rate int, d time.Duration, zipf, floor bool) {
	b.Helper()
	for b.Loop() {
		wb.drive(b, rate, 2*time.Second, zipf, false) // the warm-up: pools, prepared statements, turns
		wb.settle(b)
		before := wb.figures(b)
		cpu, err := pgtest.SampleServerCPU(wb.ctx, wb.admin, 100*time.Millisecond)
		require.NoError(b, err)
		peak := wb.watchBackends(b)
		ld := wb.drive(b, rate, d, zipf, false)
		wb.settle(b)
		backends := peak()
		byApp, err := cpu.Stop()
		require.NoError(b, err)
		after := wb.figures(b)
		lat := wb.latencies(b, ld.committed)
		commits := float64(max(ld.commits, 1))
		perCommit := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / commits }
		writer := perCommit(byApp["sdk-writer"])
		drain := perCommit(byApp["ontology-replication"] + byApp[pgtest.Ended])
		b.ReportMetric(float64(ld.commits)/ld.elapsed.Seconds(), "writers_commits/s")
		b.ReportMetric(writer, "writer_cpu_ms/commit")
		b.ReportMetric(drain, "drain_cpu_ms/commit")
		b.ReportMetric(drain/max(writer, 0.001), "drain/writer")
		b.ReportMetric(float64(after.statements-before.statements)/commits, "statements/commit")
		b.ReportMetric(float64(after.sessions-before.sessions)/commits, "sessions/commit")
		b.ReportMetric(float64(backends), "peak_drain_backends")
		b.ReportMetric(ms(percentileOf(lat, 0.5)), "p50_ms")
		b.ReportMetric(ms(percentileOf(lat, 0.99)), "p99_ms")
		answers := sortedDurations(ld.answers)
		b.ReportMetric(ms(percentileOf(answers, 0.5)), "answer_p50_ms")
		b.ReportMetric(ms(percentileOf(answers, 0.99)), "answer_p99_ms")
		b.ReportMetric(ms(percentileOf(answers, 1)), "answer_max_ms")
		not2xx := 0
		for code, n := range ld.statuses {
			if code/100 != 2 {
				not2xx += n
			}
		}
		b.ReportMetric(float64(not2xx), "answers_not_2xx")
		if floor {
			fcpu, err := pgtest.SampleServerCPU(wb.ctx, wb.admin, 100*time.Millisecond)
			require.NoError(b, err)
			fl := wb.drive(b, rate, d, zipf, true)
			fByApp, err := fcpu.Stop()
			require.NoError(b, err)
			fCommits := float64(max(fl.commits, 1))
			floorCPU := float64(fByApp["floor"].Microseconds()) / 1000 / fCommits
			fWriter := float64(fByApp["sdk-writer"].Microseconds()) / 1000 / fCommits
			b.ReportMetric(floorCPU/max(fWriter, 0.001), "floor/writer")
		}
		if os.Getenv("REPLICATION_WAKEUP_DEBUG") != "" {
			fmt.Fprintf(os.Stderr, "cpu by process: %v; answers %v; commits %d failed %d\n", byApp, ld.statuses, ld.commits, ld.failed)
		}
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func sortedDurations(ds []time.Duration) []time.Duration {
	out := slices.Clone(ds)
	slices.Sort(out)
	return out
}

// benchRates reads a comma-separated list of whole numbers (def when the
// variable is unset).
func benchRates(b *testing.B, name, def string) []int {
	raw := def
	if v := os.Getenv(name); v != "" {
		raw = v
	}
	var out []int
	for f := range strings.SplitSeq(raw, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		require.NoError(b, err, name)
		out = append(out, n)
	}
	return out
}
