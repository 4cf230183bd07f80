package delivery_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"slices"
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
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
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
