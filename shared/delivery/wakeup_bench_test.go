package delivery_test

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/plots"
)

// The ways BenchmarkWakeUps drains the same workload, in a turning order
// within each iteration.
const (
	// wakeCoalesced: each commit's wake-up goes to Service.Drain (the
	// drain function), on one of four instances: the product.
	wakeCoalesced = "coalesced"
	// wakeEach: each wake-up claims one batch on its own, as the drain did
	// before its wake-ups coalesced (the verifier's sweep's drainOnce).
	wakeEach = "each"
	// wakeFloor: no wake-up; one drainer takes everything pending every
	// gather (the drain's, so at about its latency;
	// REPLICATION_WAKEUP_FLOOR_EVERY) with the least SQL
	// (sdkfixture.FloorDrain: one statement per 100 events that claims,
	// reads and accepts, nothing published): a coalescing floor no drain
	// with the seed's protocol can reach.
	wakeFloor = "floor"
)

// BenchmarkWakeUps drives the wake-up path as the SDK does: eight SDK
// writers commit at a set rate, and each commit is followed by a wake-up
// (not awaited by the writer) to one of four drain instances, each with
// its own pools (two connections, as the drain function's), for each rate
// of REPLICATION_WAKEUP_RATES (commits a second; default 1,10,50,150,300,500)
// over REPLICATION_WAKEUP_SECONDS (default 10, and at least 30 commits;
// rate 0 is an idle workspace for a minute, whose drain statements it
// reports), after a warm-up at the same rate that it does not measure
// (REPLICATION_WAKEUP_WARMUP, default 2s): the figures are a steady
// rate's. The warm-up is a burst's start, where each instance's first
// half-dozen wake-ups claim on their own until it sees the workspace busy;
// its drain CPU per commit is reported apart (warmup_drain_cpu_ms/commit).
// Each iteration runs the same workload three ways in a turning order: the
// drain function's coalesced wake-ups, a claim per wake-up as before, and a
// coalescing floor (wakeFloor). From the server's own counters it reports
// PostgreSQL CPU per commit (backends by application_name, from /proc) of
// the writers, the drain and the floor, the drain's ratio to the writers'
// and to the floor's, statements per commit (pg_stat_statements by role)
// and round trips per commit, and commit → accepted latency p50 and p99
// (the floor's too: what its interval costs in latency).
// Run with
//
//	go test -run='^$' -bench=WakeUps -benchtime=1x -timeout=60m ./shared/delivery/
func BenchmarkWakeUps(b *testing.B) {
	rates := []int{1, 10, 50, 150, 300, 500}
	if v := os.Getenv("REPLICATION_WAKEUP_RATES"); v != "" {
		rates = rates[:0]
		for f := range strings.SplitSeq(v, ",") {
			n, err := strconv.Atoi(f)
			require.NoError(b, err)
			rates = append(rates, n)
		}
	}
	seconds := 10
	if v := os.Getenv("REPLICATION_WAKEUP_SECONDS"); v != "" {
		var err error
		seconds, err = strconv.Atoi(v)
		require.NoError(b, err)
	}
	for _, rate := range rates {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) {
			r := newWakeRig(b)
			if rate == 0 {
				// An idle workspace, for a minute: the drain sends nothing.
				d := time.Duration(max(seconds, 60)) * time.Second
				var statements int64
				for b.Loop() {
					statements += r.run(b, wakeCoalesced, 0, d).statements
				}
				b.ReportMetric(float64(statements)/float64(b.N), "statements/minute_idle")
				return
			}
			d := max(time.Duration(seconds)*time.Second, time.Duration(30*int(time.Second)/rate))
			ways := []string{wakeCoalesced, wakeEach, wakeFloor}
			sum := map[string]*wakePhase{}
			i := 0
			for b.Loop() {
				for k := range ways {
					way := ways[(i+k)%len(ways)]
					ph := r.run(b, way, rate, d)
					s := cmp.Or(sum[way], &wakePhase{})
					s.commits += ph.commits
					s.warmCommits += ph.warmCommits
					s.warmDrainCPU += ph.warmDrainCPU
					s.writerCPU += ph.writerCPU
					s.drainCPU += ph.drainCPU
					s.statements += ph.statements
					s.trips += ph.trips
					s.latencies = append(s.latencies, ph.latencies...)
					s.coalesced += ph.coalesced
					s.waited += ph.waited
					s.wakeUps += ph.wakeUps
					sum[way] = s
				}
				i++
			}
			perCommit := func(d time.Duration, n int) float64 { return float64(d.Microseconds()) / 1000 / float64(max(n, 1)) }
			c, e, f := sum[wakeCoalesced], sum[wakeEach], sum[wakeFloor]
			for _, s := range sum {
				slices.Sort(s.latencies)
			}
			writer := perCommit(c.writerCPU+e.writerCPU+f.writerCPU, c.commits+e.commits+f.commits)
			drain := perCommit(c.drainCPU, c.commits)
			b.ReportMetric(writer, "writer_cpu_ms/commit")
			b.ReportMetric(drain, "drain_cpu_ms/commit")
			b.ReportMetric(perCommit(c.warmDrainCPU, c.warmCommits), "warmup_drain_cpu_ms/commit")
			b.ReportMetric(perCommit(e.drainCPU, e.commits), "each_cpu_ms/commit")
			b.ReportMetric(perCommit(f.drainCPU, f.commits), "floor_cpu_ms/commit")
			b.ReportMetric(drain/writer, "drain/writer")
			b.ReportMetric(drain/max(perCommit(f.drainCPU, f.commits), 0.001), "drain/floor")
			b.ReportMetric(float64(c.statements)/float64(max(c.commits, 1)), "statements/commit")
			b.ReportMetric(float64(e.statements)/float64(max(e.commits, 1)), "each_statements/commit")
			b.ReportMetric(float64(c.trips)/float64(max(c.commits, 1)), "roundtrips/commit")
			b.ReportMetric(float64(c.coalesced)/float64(max(c.wakeUps, 1)), "coalesced/wakeup")
			b.ReportMetric(float64(percentile(c.latencies, 0.5).Microseconds())/1000, "p50_ms")
			b.ReportMetric(float64(percentile(c.latencies, 0.99).Microseconds())/1000, "p99_ms")
			b.ReportMetric(float64(percentile(e.latencies, 0.5).Microseconds())/1000, "each_p50_ms")
			b.ReportMetric(float64(percentile(e.latencies, 0.99).Microseconds())/1000, "each_p99_ms")
			b.ReportMetric(float64(percentile(f.latencies, 0.5).Microseconds())/1000, "floor_p50_ms")
			b.ReportMetric(float64(percentile(f.latencies, 0.99).Microseconds())/1000, "floor_p99_ms")
			if dir := os.Getenv("REPLICATION_WAKEUP_PLOT"); dir != "" {
				ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
				recordFrontier(b, dir, plots.FrontierPoint{GatherMS: ms(r.gather), Rate: float64(rate), DrainMS: drain, FloorMS: perCommit(f.drainCPU, f.commits),
					DrainP50: ms(percentile(c.latencies, 0.5)), DrainP99: ms(percentile(c.latencies, 0.99)),
					FloorP50: ms(percentile(f.latencies, 0.5)), FloorP99: ms(percentile(f.latencies, 0.99))})
			}
		})
	}
}

// recordFrontier adds a measured point to dir/wakeups.csv (REPLICATION_WAKEUP_PLOT)
// and draws every point recorded there to dir/frontier.svg: the drain's and
// the floor's cost against latency by gather at 150 commits/s, and against
// the rate at the default gather. Runs with other gathers
// (REPLICATION_WAKEUP_GATHER) add their points to the same files.
func recordFrontier(b *testing.B, dir string, p plots.FrontierPoint) {
	b.Helper()
	path := filepath.Join(dir, "wakeups.csv")
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	require.NoError(b, err)
	_, err = fmt.Fprintf(f, "%g,%g,%g,%g,%g,%g,%g,%g\n", p.GatherMS, p.Rate, p.DrainMS, p.FloorMS, p.DrainP50, p.DrainP99, p.FloorP50, p.FloorP99)
	require.NoError(b, err)
	require.NoError(b, f.Close())
	raw, err := os.ReadFile(path)
	require.NoError(b, err)
	var pts []plots.FrontierPoint
	for line := range strings.SplitSeq(strings.TrimSpace(string(raw)), "\n") {
		var q plots.FrontierPoint
		_, err := fmt.Sscanf(line, "%g,%g,%g,%g,%g,%g,%g,%g", &q.GatherMS, &q.Rate, &q.DrainMS, &q.FloorMS, &q.DrainP50, &q.DrainP99, &q.FloorP50, &q.FloorP99)
		require.NoError(b, err, line)
		pts = append(pts, q)
	}
	require.NoError(b, plots.SaveFrontier(filepath.Join(dir, "frontier.svg"), pts, 150, float64(delivery.DefaultGather.Milliseconds())))
}
