package functions

import (
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/plots"
)

// BenchmarkWakeUps drives the wake-up path as the SDK does, on one
// workspace: 8 SDK writers commit at REPLICATION_WAKEUP_RATES commits a
// second in all (default 150; 0 is an idle workspace, whose
// statements/commit is then every statement the drain sent), each awaiting its commit's wake-up (HTTP,
// the runtime token, the SDK's 5 s) before its next commit, to one of 4
// instances of the drain, with Pub/Sub answering at once (pubsub=fast) and
// with every Publish held 1 s (pubsub=slow), for REPLICATION_WAKEUP_SECONDS
// (default 10) after a 2 s warm-up at the rate that is not measured. After
// it, the floor: no wake-up; every gather (REPLICATION_WAKEUP_GATHER, the
// drain's DRAIN_GATHER, default 85ms) the workspace's commits drained on a
// warm connection with the least SQL that can publish between claiming and
// accepting (floorDrainer). It reports the answers (p50, p99, max, and
// those not 2xx), the writers' achieved rate, commit → accepted (p50,
// p99), and from the server's own counters the drain's PostgreSQL CPU a
// commit against the writers' and the floor's (backends by
// application_name from /proc, and the CPU of sessions that ended between
// samples), its statements a commit (pg_stat_statements) and the sessions
// it opened. REPLICATION_WAKEUP_PLOT=DIR records each run and draws
// DIR/answers.svg and DIR/frontier.svg (see record). Run with
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
// role's server sessions. REPLICATION_FLEET_PLOT=DIR records each run in
// DIR/fleet.csv and draws them all to DIR/fleet.svg (recordFleet).
// Setting up 1,000 databases takes minutes: run the sizes you need,
// -bench='WakeUpsFleet/workspaces=200/'.
func BenchmarkWakeUpsFleet(b *testing.B) {
	seconds := benchEnvInt(b, "REPLICATION_WAKEUP_SECONDS", 10)
	sizes := benchRates(b, "REPLICATION_FLEET_SIZES", "1,50,200,1000")
	for _, n := range sizes {
		for _, mode := range []string{"direct", "pooled"} {
			for _, skew := range []string{"uniform", "zipf"} {
				b.Run(fmt.Sprintf("workspaces=%d/%s/%s", n, mode, skew), func(b *testing.B) {
					wb := newWakeBench(b, wakeBenchConfig{workspaces: n, pooled: mode == "pooled", floor: n <= 50})
					for _, rate := range benchRates(b, "REPLICATION_WAKEUP_RATES", "150") {
						m := runWakeLoad(b, wb, rate, time.Duration(seconds)*time.Second, skew == "zipf", n <= 50)
						if dir := os.Getenv("REPLICATION_FLEET_PLOT"); dir != "" {
							recordFleet(b, dir, []string{fmt.Sprint(n), mode, skew}, m)
						}
					}
				})
			}
		}
	}
}

// runWakeLoad warms the bench up at rate, then measures d at the rate
// (and, with floor, the floor's d after it), and reports. The warm-up is
// 2 s, or long enough for three commits a workspace on a fleet, so that
// what is measured is the steady state: a pooler's first server session
// of a database, and its cold caches, are not.
func runWakeLoad(b *testing.B, wb *wakeBench, rate int, d time.Duration, zipf, floor bool) wakeFigures {
	b.Helper()
	var m wakeFigures
	warm := max(2*time.Second, time.Duration(3*len(wb.spaces))*time.Second/time.Duration(max(rate, 1)))
	for b.Loop() {
		wb.drive(b, rate, warm, zipf, false) // the warm-up: pools, prepared statements, turns, the pooler's sessions
		wb.settle(b)
		m = wb.measure(b, rate, d, zipf, false)
		m.report(b)
		if floor {
			f := wb.measure(b, rate, d, zipf, true)
			b.ReportMetric(f.drainCPU/max(f.writerCPU, 0.001), "floor/writer")
			b.ReportMetric(f.p50, "floor_p50_ms")
			b.ReportMetric(f.p99, "floor_p99_ms")
			m.floor = &f
		}
		if dir := os.Getenv("REPLICATION_WAKEUP_PLOT"); dir != "" {
			wb.record(b, dir, rate, m)
		}
	}
	return m
}

// recordFleet adds a fleet run (its workspaces, "direct" or "pooled",
// "uniform" or "zipf") to dir/fleet.csv (REPLICATION_FLEET_PLOT) and
// draws every run recorded there to dir/fleet.svg.
func recordFleet(b *testing.B, dir string, run []string, m wakeFigures) {
	b.Helper()
	rows := readCSV(b, filepath.Join(dir, "fleet.csv"), append(run,
		fmt.Sprint(m.drainCPU/max(m.writerCPU, 0.001)), fmt.Sprint(m.sessions), fmt.Sprint(m.p99)))
	var runs []plots.FleetRun
	for _, r := range rows {
		v := floats(b, append([]string{r[0]}, r[3:]...))
		runs = append(runs, plots.FleetRun{Workspaces: int(v[0]), Pooled: r[1] == "pooled", Zipf: r[2] == "zipf",
			CPUShare: v[1], Sessions: v[2], AcceptedP99: v[3]})
	}
	require.NoError(b, plots.SaveFleet(filepath.Join(dir, "fleet.svg"), runs))
}

// wakeFigures are one measured run's figures: the writers' rate and CPU
// a commit, the drain's (or the floor's) CPU a commit and statements,
// sessions opened, the drain role's peak sessions, commit → accepted and
// the answers (milliseconds).
type wakeFigures struct {
	pubsub                          string
	rate                            float64
	writerCPU, drainCPU             float64
	statements, sessions, backends  float64
	p50, p99                        float64
	answerP50, answerP99, answerMax float64
	not2xx                          int
	floor                           *wakeFigures
}

// measure drives d at rate (the floor's way with floor) and reads the
// server's counters around it.
func (wb *wakeBench) measure(b *testing.B, rate int, d time.Duration, zipf, floor bool) wakeFigures {
	b.Helper()
	before := wb.figures(b)
	cpu, err := pgtest.SampleServerCPU(wb.ctx, wb.admin, 100*time.Millisecond)
	require.NoError(b, err)
	peak := wb.watchBackends(b)
	ld := wb.drive(b, rate, d, zipf, floor)
	wb.settle(b)
	backends := peak()
	byApp, err := cpu.Stop()
	require.NoError(b, err)
	after := wb.figures(b)
	lat := wb.latencies(b, ld.committed)
	commits := float64(max(ld.commits, 1))
	perCommit := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / commits }
	answers := sortedDurations(ld.answers)
	m := wakeFigures{pubsub: wb.pubsub(), rate: float64(ld.commits) / ld.elapsed.Seconds(),
		writerCPU: perCommit(byApp["sdk-writer"]), drainCPU: perCommit(byApp["ontology-replication"] + byApp[pgtest.Ended]),
		statements: float64(after.statements-before.statements) / commits, sessions: float64(after.sessions-before.sessions) / commits,
		backends: float64(backends), p50: ms(percentileOf(lat, 0.5)), p99: ms(percentileOf(lat, 0.99)),
		answerP50: ms(percentileOf(answers, 0.5)), answerP99: ms(percentileOf(answers, 0.99)), answerMax: ms(percentileOf(answers, 1))}
	if floor {
		m.drainCPU = perCommit(byApp["floor"])
	}
	for code, n := range ld.statuses {
		if code/100 != 2 {
			m.not2xx += n
		}
	}
	if os.Getenv("REPLICATION_WAKEUP_DEBUG") != "" {
		fmt.Fprintf(os.Stderr, "cpu by process: %v; answers %v; commits %d failed %d\n", byApp, ld.statuses, ld.commits, ld.failed)
		wb.debugStatements(b)
		if wb.pooler != nil {
			closing := map[string]int{}
			for _, l := range strings.Split(wb.pooler.Log(), "\n") {
				if i := strings.Index(l, "closing because: "); i >= 0 {
					closing[l[i:]]++
				}
			}
			fmt.Fprintf(os.Stderr, "pooler closings: %v\n", closing)
		}
	}
	return m
}

// report reports the drain's figures.
func (m wakeFigures) report(b *testing.B) {
	b.ReportMetric(m.rate, "writers_commits/s")
	b.ReportMetric(m.writerCPU, "writer_cpu_ms/commit")
	b.ReportMetric(m.drainCPU, "drain_cpu_ms/commit")
	b.ReportMetric(m.drainCPU/max(m.writerCPU, 0.001), "drain/writer")
	b.ReportMetric(m.statements, "statements/commit")
	b.ReportMetric(m.sessions, "sessions/commit")
	b.ReportMetric(m.backends, "peak_drain_backends")
	b.ReportMetric(m.p50, "p50_ms")
	b.ReportMetric(m.p99, "p99_ms")
	b.ReportMetric(m.answerP50, "answer_p50_ms")
	b.ReportMetric(m.answerP99, "answer_p99_ms")
	b.ReportMetric(m.answerMax, "answer_max_ms")
	b.ReportMetric(float64(m.not2xx), "answers_not_2xx")
}

// pubsub names the bench's Pub/Sub: fast, or each Publish's delay.
func (wb *wakeBench) pubsub() string {
	if d := time.Duration(wb.delay.Load()); d > 0 {
		return "held " + d.String()
	}
	return "fast"
}

// record adds a measured run to dir (REPLICATION_WAKEUP_PLOT) and draws
// every run recorded there: dir/answers.csv and dir/answers.svg, the
// answers and commit → accepted, labelled REPLICATION_WAKEUP_LABEL (the
// build measured: "before", "after") and the Pub/Sub; dir/wakeups.csv and
// dir/frontier.svg, the drain's and the floor's cost against latency by
// gather (REPLICATION_WAKEUP_GATHER) and against the rate.
func (wb *wakeBench) record(b *testing.B, dir string, rate int, m wakeFigures) {
	b.Helper()
	label := strings.TrimSpace(os.Getenv("REPLICATION_WAKEUP_LABEL") + " " + m.pubsub)
	answers := readCSV(b, filepath.Join(dir, "answers.csv"), []string{label,
		fmt.Sprint(m.answerP50), fmt.Sprint(m.answerP99), fmt.Sprint(m.answerMax), fmt.Sprint(m.p50), fmt.Sprint(m.p99), fmt.Sprint(m.rate)})
	var runs []plots.AnswerRun
	for _, r := range answers {
		v := floats(b, r[1:])
		runs = append(runs, plots.AnswerRun{Label: r[0], AnswerP50: v[0], AnswerP99: v[1], AnswerMax: v[2], AcceptedP50: v[3], AcceptedP99: v[4], Achieved: v[5]})
	}
	require.NoError(b, plots.SaveAnswers(filepath.Join(dir, "answers.svg"), runs))
	if m.floor == nil || m.pubsub != "fast" {
		return
	}
	f := m.floor
	rows := readCSV(b, filepath.Join(dir, "wakeups.csv"), []string{fmt.Sprint(ms(wb.gather)), fmt.Sprint(rate),
		fmt.Sprint(m.drainCPU), fmt.Sprint(f.drainCPU), fmt.Sprint(m.p50), fmt.Sprint(m.p99), fmt.Sprint(f.p50), fmt.Sprint(f.p99), fmt.Sprint(m.writerCPU)})
	var pts []plots.FrontierPoint
	for _, r := range rows {
		v := floats(b, r)
		pt := plots.FrontierPoint{GatherMS: v[0], Rate: v[1], DrainMS: v[2], FloorMS: v[3], DrainP50: v[4], DrainP99: v[5], FloorP50: v[6], FloorP99: v[7]}
		if len(v) > 8 { // rows recorded before the writers' CPU was have 8
			pt.WritersMS = v[8]
		}
		pts = append(pts, pt)
	}
	require.NoError(b, plots.SaveFrontier(filepath.Join(dir, "frontier.svg"), pts, 150, float64(delivery.DefaultGather.Milliseconds())))
}

// readCSV appends row to the CSV file at path and returns every row in it.
func readCSV(b *testing.B, path string, row []string) [][]string {
	b.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_RDWR, 0o644)
	require.NoError(b, err)
	defer f.Close()
	w := csv.NewWriter(f)
	require.NoError(b, w.Write(row))
	w.Flush()
	require.NoError(b, w.Error())
	_, err = f.Seek(0, 0)
	require.NoError(b, err)
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1 // rows of an older bench may have fewer columns
	rows, err := r.ReadAll()
	require.NoError(b, err)
	return rows
}

// floats parses a CSV row's numbers.
func floats(b *testing.B, fields []string) []float64 {
	out := make([]float64, len(fields))
	for i, f := range fields {
		v, err := strconv.ParseFloat(f, 64)
		require.NoError(b, err, f)
		out[i] = v
	}
	return out
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

// debugStatements prints the drain role's statements by their total time
// (planning and execution; REPLICATION_WAKEUP_DEBUG), and resets them.
func (wb *wakeBench) debugStatements(b *testing.B) {
	b.Helper()
	rows, err := wb.admin.Query(wb.ctx, `SELECT calls, round((total_plan_time + total_exec_time)::numeric, 1), round(total_plan_time::numeric, 1),
		left(regexp_replace(query, '\s+', ' ', 'g'), 90)
		FROM pg_stat_statements s JOIN pg_roles u ON u.oid = s.userid WHERE u.rolname = 'drainer'
		ORDER BY total_plan_time + total_exec_time DESC LIMIT 12`)
	require.NoError(b, err)
	var calls int64
	var total, plan float64
	var query string
	_, err = pgx.ForEachRow(rows, []any{&calls, &total, &plan, &query}, func() error {
		fmt.Fprintf(os.Stderr, "%8d calls %9.1f ms (plan %8.1f) %s\n", calls, total, plan, query)
		return nil
	})
	require.NoError(b, err)
	_, err = wb.admin.Exec(wb.ctx, `SELECT pg_stat_statements_reset()`)
	require.NoError(b, err)
}
