package delivery_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/publish"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// fleetRig is n workspaces on one PostgreSQL server of its own, each with
// an active generation and events accepted (due for verification), and a
// BigQuery stand-in answering every lookup after 1–2 s with every id asked
// (everything landed).
type fleetRig struct {
	cluster *pgtest.Cluster
	urls    []string
	bqURL   string
	bq      *bqserver.Server
	pub     *publish.Publisher
	// seen, when set before a pass, sees every lookup.
	seen func(q bqserver.Query)
}

func newFleetRig(tb testing.TB, n, events int) *fleetRig {
	tb.Helper()
	ctx := context.Background()
	c, err := pgtest.Start(ctx, pgtest.Config{Settings: map[string]string{"max_connections": "300"}})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = c.Stop() })
	f := &fleetRig{cluster: c}
	var mu sync.Mutex
	var wg sync.WaitGroup
	work := make(chan int)
	for range 4 {
		wg.Go(func() {
			for range work {
				url := c.NewDatabase(tb, &sdkfixture.V4Template)
				pool, err := pgxpool.New(ctx, url)
				require.NoError(tb, err)
				g, err := sdkfixture.StartGeneration(ctx, pool, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
				require.NoError(tb, err)
				require.NoError(tb, sdkfixture.BulkCreate(ctx, pool, sdkfixture.Demo, "product", "title", events, events))
				// Accepted, as a drain leaves them (the drain is not what
				// is measured here).
				_, err = pool.Exec(ctx, `WITH a AS (UPDATE _ontology_replication_delivery SET accepted_at = now(), next_verify_at = now()
					WHERE generation = $1::uuid RETURNING event_id, accepted_at)
					INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at) SELECT $1::uuid, event_id, accepted_at FROM a`, g.Generation)
				require.NoError(tb, err)
				pool.Close()
				mu.Lock()
				f.urls = append(f.urls, url)
				mu.Unlock()
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	f.bq = bqserver.New(func(ctx context.Context, q bqserver.Query) (bqserver.Result, error) {
		if f.seen != nil {
			f.seen(q)
		}
		select {
		case <-time.After(time.Second + rand.N(time.Second)):
		case <-ctx.Done():
			return bqserver.Result{}, ctx.Err()
		}
		return bqserver.Strings("event_id", q.Params["ids"].Values), nil
	})
	srv := httptest.NewServer(f.bq)
	tb.Cleanup(srv.Close)
	f.bqURL = srv.URL
	ps := pstest.NewServer()
	tb.Cleanup(func() { _ = ps.Close() })
	f.pub, err = publish.New(ctx, publish.Config{EmulatorHost: ps.Addr})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = f.pub.Close() })
	return f
}

// registry is the fleet's registry: each workspace with its own events
// table, or all in one (shared), plus extra workspaces registered but never
// used (databases that do not exist).
func (f *fleetRig) registry(tb testing.TB, shared bool, extra int) *registry.Registry {
	tb.Helper()
	var sb strings.Builder
	sb.WriteString(`{"workspaces": [`)
	for i, url := range f.urls {
		dataset := fmt.Sprintf("ds_%04d", i)
		if shared {
			dataset = "ontology_internal"
		}
		fmt.Fprintf(&sb, `{"id": "w%05d", "database": {"url": %q}, "pubsub": {"project": "p1", "topic": "events-%d"},
			"bigquery": {"project": "p1", "dataset": %q, "endpoint": %q}},`, i, url, i, dataset, f.bqURL)
	}
	for i := range extra {
		fmt.Fprintf(&sb, `{"id": "idle%05d", "database": {"url": %q}, "pubsub": {"project": "p1", "topic": "idle-%d"},
			"bigquery": {"project": "p1", "dataset": "idle_%05d", "endpoint": %q}},`, i, f.cluster.URL(fmt.Sprintf("idle_%05d", i)), i, i, f.bqURL)
	}
	raw := strings.TrimSuffix(sb.String(), ",") + "]}"
	reg, err := registry.Parse([]byte(raw))
	require.NoError(tb, err)
	return reg
}

// service is a verifier instance over the registry, as the functions build
// it (default pools: 2 connections, 64 open).
func (f *fleetRig) service(tb testing.TB, reg *registry.Registry) *delivery.Service {
	tb.Helper()
	pools, err := database.New(database.Config{MaxOpen: 64})
	require.NoError(tb, err)
	tb.Cleanup(pools.Close)
	wh, err := warehouse.NewBigQuery(warehouse.Config{})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = wh.Close() })
	svc, err := delivery.New(delivery.Config{Registry: reg, Pools: pools, Publisher: f.pub, Warehouse: wh, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(tb, err)
	return svc
}

// unverify makes every event due again, outside the timed part.
func (f *fleetRig) unverify(tb testing.TB) {
	tb.Helper()
	ctx := context.Background()
	for _, url := range f.urls {
		conn, err := pgxpool.New(ctx, url)
		require.NoError(tb, err)
		_, err = conn.Exec(ctx, `UPDATE _ontology_replication_delivery SET verified_at = NULL, last_checked_at = NULL, next_verify_at = now() WHERE verified_at IS NOT NULL`)
		require.NoError(tb, err)
		_, err = conn.Exec(ctx, `UPDATE _ontology_replication_receipts SET verified_at = NULL`)
		require.NoError(tb, err)
		conn.Close()
	}
}

// BenchmarkVerifyFleet measures one verifier pass (the default 50 s budget
// and VERIFY_WORKERS of 8, 16 (the default) and 32) over 10, 100 and 1,000
// workspaces of 20 due events on one PostgreSQL, BigQuery answering after
// 1–2 s, each workspace with its own events table or all sharing one:
// verified events/s, the workspaces the pass reached, passes a minute (a
// pass is at most the budget; the scheduler starts one a minute), BigQuery
// queries, and the most connections the verifier held at once. Setting up
// 1,000 databases takes minutes: run the sizes you need,
// -bench='VerifyFleet/workspaces=100/'.
func BenchmarkVerifyFleet(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("workspaces=%d", n), func(b *testing.B) {
			f := newFleetRig(b, n, 20)
			for _, layout := range []string{"own-tables", "shared-table"} {
				for _, workers := range []int{8, 16, 32} {
					b.Run(fmt.Sprintf("%s/workers=%d", layout, workers), func(b *testing.B) {
						svc := f.service(b, f.registry(b, layout == "shared-table", 0))
						var verified, reached, lookups int
						var elapsed time.Duration
						var peak int64
						for b.Loop() {
							b.StopTimer()
							f.unverify(b)
							stop := f.cluster.WatchClientConnections(b)
							b.StartTimer()
							started := time.Now()
							pass := svc.VerifyAll(context.Background(), delivery.VerifyAllOptions{Budget: 50 * time.Second, Workers: workers})
							elapsed += time.Since(started)
							b.StopTimer()
							peak = max(peak, stop())
							for _, r := range pass.Workspaces {
								verified += r.Verified
								if r.Outcome != delivery.OutcomeNotReached {
									reached++
								}
							}
							lookups += pass.Lookups
							b.StartTimer()
						}
						passes := float64(b.N)
						b.ReportMetric(float64(verified)/elapsed.Seconds(), "verified/s")
						b.ReportMetric(float64(reached)/passes, "reached/pass")
						b.ReportMetric(min(60, 60/(elapsed.Seconds()/passes)), "passes/min")
						b.ReportMetric(float64(lookups)/passes, "lookups/pass")
						b.ReportMetric(float64(peak), "peak-conns")
					})
				}
			}
		})
	}
}

// BenchmarkFleetMemory measures the verifier's memory for a fleet: 10,000
// workspaces registered, 100 of them active (verified, so their pools and
// stores are open): heap per registered workspace and per active one, and
// the process's RSS.
func BenchmarkFleetMemory(b *testing.B) {
	f := newFleetRig(b, 100, 20)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	for b.Loop() {
		base := heap()
		reg := f.registry(b, false, 9_900)
		svc := f.service(b, reg)
		registered := heap()
		f.unverify(b)
		var ids []string
		for i := range f.urls {
			ids = append(ids, fmt.Sprintf("w%05d", i))
		}
		pass := svc.VerifyAll(context.Background(), delivery.VerifyAllOptions{Workspaces: ids, Budget: 5 * time.Minute, Workers: 32})
		require.False(b, pass.Failed(), "%+v", pass)
		active := heap()
		b.ReportMetric(float64(registered-base)/10_000, "heap-B/registered")
		b.ReportMetric(float64(active-registered)/100, "heap-B/active")
		b.ReportMetric(float64(rss())/(1<<20), "rss-MB")
		runtime.KeepAlive(svc)
	}
}

// rss is the process's resident set size, from /proc/self/status.
func rss() int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return -1
}
