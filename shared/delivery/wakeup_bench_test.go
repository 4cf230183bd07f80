package delivery_test

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/publish"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/plots"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
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

// wakeRig is one workspace on a cluster of the benchmark's own, with
// pg_stat_statements: SDK writers as one role, four drain instances (each
// its own pools) as another, the floor as a third.
type wakeRig struct {
	ctx       context.Context
	cluster   *pgtest.Cluster
	admin     *pgxpool.Pool // the workspace's database, as the superuser
	writers   *pgxpool.Pool // application_name sdk-writer
	floor     *pgx.Conn     // role floor
	w         *sdkfixture.Writer
	gen       string
	instances []*delivery.Service
	trips     *counter      // the drains' round trips
	every     time.Duration // the floor's interval (the drain's gather; REPLICATION_WAKEUP_FLOOR_EVERY)
	gather    time.Duration // the drain's gather (REPLICATION_WAKEUP_GATHER)
	warm      time.Duration // each phase's warm-up, not measured (REPLICATION_WAKEUP_WARMUP)
}

func newWakeRig(b *testing.B) *wakeRig {
	b.Helper()
	ctx := context.Background()
	cluster, err := pgtest.Start(ctx, pgtest.Config{Disposable: true, Settings: map[string]string{
		"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all", "pg_stat_statements.track_planning": "on",
		"autovacuum_naptime": "10s"}})
	require.NoError(b, err)
	b.Cleanup(func() { _ = cluster.Stop() })
	dbURL := cluster.NewDatabase(b, &sdkfixture.V4Template)
	r := &wakeRig{ctx: ctx, cluster: cluster, trips: &counter{}}
	r.admin, err = pgxpool.New(ctx, dbURL)
	require.NoError(b, err)
	b.Cleanup(r.admin.Close)
	for _, q := range []string{`CREATE EXTENSION IF NOT EXISTS pg_stat_statements`,
		`CREATE ROLE drainer SUPERUSER LOGIN PASSWORD 'drainer'`, `CREATE ROLE floor SUPERUSER LOGIN PASSWORD 'floor'`} {
		_, err := r.admin.Exec(ctx, q)
		require.NoError(b, err)
	}
	g, err := sdkfixture.StartGeneration(ctx, r.admin, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
	require.NoError(b, err)
	r.gen = g.Generation
	as := func(user, app string) string {
		u, err := url.Parse(dbURL)
		require.NoError(b, err)
		u.User = url.UserPassword(user, user)
		if user == "" {
			u.User = nil
			u, _ = url.Parse(dbURL)
		}
		q := u.Query()
		q.Set("application_name", app)
		u.RawQuery = q.Encode()
		return u.String()
	}
	r.writers, err = pgxpool.New(ctx, as("", "sdk-writer")+"&pool_max_conns=8")
	require.NoError(b, err)
	b.Cleanup(r.writers.Close)
	r.w = sdkfixture.NewWriter(r.writers, sdkfixture.Demo)
	r.floor, err = pgx.Connect(ctx, as("floor", "floor"))
	require.NoError(b, err)
	b.Cleanup(func() { _ = r.floor.Close(ctx) })

	srv := pstest.NewServer()
	b.Cleanup(func() { _ = srv.Close() })
	_, err = srv.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/p1/topics/events"})
	require.NoError(b, err)
	pub, err := publish.New(ctx, publish.Config{EmulatorHost: srv.Addr})
	require.NoError(b, err)
	b.Cleanup(func() { _ = pub.Close() })
	drainURL, err := url.Parse(dbURL)
	require.NoError(b, err)
	drainURL.User = url.UserPassword("drainer", "drainer")
	reg, err := registry.Parse(fmt.Appendf(nil, `{"workspaces": [{"id": "w1", "database": {"url": %q},
		"pubsub": {"project": "p1", "topic": "events"}, "bigquery": {"project": "p1"}}]}`, drainURL.String()))
	require.NoError(b, err)
	gather := delivery.DefaultGather
	if v := os.Getenv("REPLICATION_WAKEUP_GATHER"); v != "" {
		gather, err = time.ParseDuration(v)
		require.NoError(b, err)
	}
	for range 4 {
		// As functions/cmd builds its pools: two connections per workspace.
		pools, err := database.New(database.Config{Tracer: r.trips, MaxConns: 2})
		require.NoError(b, err)
		b.Cleanup(pools.Close)
		cfg := delivery.Config{Registry: reg, Pools: pools, Publisher: pub, Gather: gather, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
		svc, err := delivery.New(cfg)
		require.NoError(b, err)
		r.instances = append(r.instances, svc)
	}
	r.gather = gather
	r.every = max(gather, time.Millisecond)
	if v := os.Getenv("REPLICATION_WAKEUP_FLOOR_EVERY"); v != "" {
		r.every, err = time.ParseDuration(v)
		require.NoError(b, err)
	}
	r.warm = 2 * time.Second
	if v := os.Getenv("REPLICATION_WAKEUP_WARMUP"); v != "" {
		r.warm, err = time.ParseDuration(v)
		require.NoError(b, err)
	}
	// Warm: pools, prepared statements, the capture tables.
	for _, svc := range r.instances {
		_, err := r.w.Create(ctx, "product", map[string]any{"title": "warm"})
		require.NoError(b, err)
		_, err = svc.Drain(ctx, "w1")
		require.NoError(b, err)
	}
	return r
}

// wakePhase is one way's run at one rate: the figures it reports, of the
// commits after its warm-up, and the drain's cost in the warm-up.
type wakePhase struct {
	commits                    int
	warmCommits                int
	writerCPU, drainCPU        time.Duration
	warmDrainCPU               time.Duration
	statements, trips          int64
	latencies                  []time.Duration
	coalesced, waited, wakeUps int64
}

// statementsOf sums pg_stat_statements' calls of a role.
func (r *wakeRig) statementsOf(b *testing.B, role string) int64 {
	b.Helper()
	var n int64
	require.NoError(b, r.admin.QueryRow(r.ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements s JOIN pg_roles u ON u.oid = s.userid
		WHERE u.rolname = $1 AND s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`, role).Scan(&n))
	return n
}

// run writes at rate commits a second for the warm-up and then d, draining
// them the given way, and waits until every event is accepted. It
// measures from the end of the warm-up: a steady rate, not the burst's
// start, when each instance's first wake-ups claim on their own until it
// sees the workspace busy (the warm-up's drain cost is reported apart).
func (r *wakeRig) run(b *testing.B, way string, rate int, d time.Duration) wakePhase {
	b.Helper()
	var ph wakePhase
	drainRole := map[string]string{wakeCoalesced: "drainer", wakeEach: "drainer", wakeFloor: "floor"}[way]
	drainApp := map[string]string{wakeCoalesced: "ontology-replication", wakeEach: "ontology-replication", wakeFloor: "floor"}[way]
	warm := r.warm
	if rate == 0 {
		warm = 0
	}
	cpu, err := pgtest.SampleBackendCPU(r.ctx, r.admin, 100*time.Millisecond)
	require.NoError(b, err)
	var statements0, trips0 int64
	var measuring atomic.Bool
	measure := func() { // the warm-up's end
		ph.warmDrainCPU = cpu.Stop()[drainApp]
		statements0, trips0 = r.statementsOf(b, drainRole), r.trips.n.Load()
		cpu, err = pgtest.SampleBackendCPU(r.ctx, r.admin, 100*time.Millisecond)
		require.NoError(b, err)
		measuring.Store(true)
	}
	if warm == 0 {
		measure()
	}

	ctx, stop := context.WithCancel(r.ctx)
	var floorDone chan struct{}
	if way == wakeFloor {
		floorDone = make(chan struct{})
		go func() {
			defer close(floorDone)
			t := time.NewTicker(r.every)
			defer t.Stop()
			for {
				for {
					tag, err := r.floor.Exec(r.ctx, sdkfixture.FloorDrain, r.gen)
					if err != nil || tag.RowsAffected() < 100 {
						break
					}
				}
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
	var mu sync.Mutex
	committed := map[string]time.Time{} // record key → when its commit returned
	var wakes sync.WaitGroup
	tokens := make(chan struct{}, rate)
	var writers sync.WaitGroup
	var next atomic.Int64
	for range 8 {
		writers.Go(func() {
			for range tokens {
				id, err := r.w.Create(r.ctx, "product", map[string]any{"title": way})
				if err != nil {
					b.Error(err)
					continue
				}
				at := time.Now()
				mu.Lock()
				if measuring.Load() {
					committed[id] = at
				} else {
					ph.warmCommits++
				}
				mu.Unlock()
				if way == wakeFloor {
					continue
				}
				svc := r.instances[next.Add(1)%4]
				wakes.Go(func() {
					wctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
					defer cancel()
					var err error
					if way == wakeEach {
						_, err = svc.Sweep(wctx, "w1", 1)
					} else {
						var res delivery.DrainResult
						res, err = svc.Drain(wctx, "w1")
						if res.Coalesced {
							atomic.AddInt64(&ph.coalesced, 1)
						}
						if res.Waited > 0 {
							atomic.AddInt64(&ph.waited, 1)
						}
					}
					atomic.AddInt64(&ph.wakeUps, 1)
					if err != nil {
						b.Error(err)
					}
				})
			}
		})
	}
	if rate == 0 {
		time.Sleep(d) // an idle workspace: nothing is written, and nothing may run
	}
	interval := time.Second / time.Duration(max(rate, 1))
	start := time.Now()
	for i := 0; rate > 0 && time.Since(start) < warm+d; i++ {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait) // pacing the workload
		}
		if !measuring.Load() && time.Since(start) >= warm {
			measure()
		}
		tokens <- struct{}{}
	}
	close(tokens)
	writers.Wait()
	wakes.Wait()
	stop()
	if floorDone != nil {
		<-floorDone
		for { // what the last tick did not see
			tag, err := r.floor.Exec(r.ctx, sdkfixture.FloorDrain, r.gen)
			require.NoError(b, err)
			if tag.RowsAffected() < 100 {
				break
			}
		}
	}
	byApp := cpu.Stop()
	ph.statements = r.statementsOf(b, drainRole) - statements0 // before the debug print resets them
	if os.Getenv("REPLICATION_WAKEUP_DEBUG") != "" {
		rows, err := r.admin.Query(r.ctx, `SELECT calls, round((total_exec_time + total_plan_time)::numeric, 1) || ' (plan ' || round(total_plan_time::numeric, 1) || ')', left(regexp_replace(query, '\s+', ' ', 'g'), 90)
			FROM pg_stat_statements s JOIN pg_roles u ON u.oid = s.userid WHERE u.rolname = $1 ORDER BY total_exec_time + total_plan_time DESC LIMIT 14`, drainRole)
		require.NoError(b, err)
		for rows.Next() {
			var calls int64
			var ms, q string
			require.NoError(b, rows.Scan(&calls, &ms, &q))
			fmt.Fprintf(os.Stderr, "%s %8d %22s ms  %s\n", way, calls, ms, q)
		}
		var sessions int64
		require.NoError(b, r.admin.QueryRow(r.ctx, `SELECT sessions FROM pg_stat_database WHERE datname = current_database()`).Scan(&sessions))
		fmt.Fprintf(os.Stderr, "%s sessions so far %d; cpu by app %v commits %d\n", way, sessions, byApp, len(committed))
		_, err = r.admin.Exec(r.ctx, `SELECT pg_stat_statements_reset()`)
		require.NoError(b, err)
	}
	ph.writerCPU, ph.drainCPU = byApp["sdk-writer"], byApp[drainApp]
	if way != wakeFloor {
		ph.trips = r.trips.n.Load() - trips0
	}
	ph.commits = len(committed)
	require.Zero(b, r.count(b, `SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL`),
		"every commit's wake-up published it (%s)", way)
	rows, err := r.admin.Query(r.ctx, `SELECT h.record_id::text, d.accepted_at FROM product_history h
		JOIN _ontology_replication_delivery d ON d.event_id = h.id WHERE h.record_id = ANY ($1::uuid[])`, keys(committed))
	require.NoError(b, err)
	var key string
	var accepted time.Time
	_, err = pgx.ForEachRow(rows, []any{&key, &accepted}, func() error {
		ph.latencies = append(ph.latencies, accepted.Sub(committed[key]))
		return nil
	})
	require.NoError(b, err)
	slices.Sort(ph.latencies)
	return ph
}

func (r *wakeRig) count(b *testing.B, q string) int64 {
	b.Helper()
	var n int64
	require.NoError(b, r.admin.QueryRow(r.ctx, q).Scan(&n))
	return n
}

func keys(m map[string]time.Time) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// percentile is the p-th of sorted latencies.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*p))]
}

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
