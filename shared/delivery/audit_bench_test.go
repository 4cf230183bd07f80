package delivery_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
	"github.com/segmentstream/ontology-replication/shared/testbench/localwarehouse"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// byteCounter is a loopback TCP proxy that counts the bytes a server sends
// its clients: what the audit moves from PostgreSQL.
type byteCounter struct {
	ln   net.Listener
	sent atomic.Int64
}

func countBytes(tb testing.TB, target string) *byteCounter {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	c := &byteCounter{ln: ln}
	tb.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				_ = client.Close()
				continue
			}
			go func() { _, _ = io.Copy(server, client); _ = server.Close() }()
			go func() {
				_, _ = io.Copy(countingConn{client, &c.sent}, server)
				_ = client.Close()
			}()
		}
	}()
	return c
}

// countingConn counts what is written to it.
type countingConn struct {
	io.Writer
	n *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	n, err := c.Writer.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// countingHandler counts the bytes of an HTTP server's answers: what the
// audit moves from BigQuery.
type countingHandler struct {
	h    http.Handler
	sent atomic.Int64
}

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (w countingWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.n.Add(int64(n))
	return n, err
}

func (c *countingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.h.ServeHTTP(countingWriter{w, &c.sent}, r)
}

// cpuOf is a cluster's server CPU so far (pgtest.ServerCPU).
func cpuOf(tb testing.TB, pool *pgxpool.Pool) time.Duration {
	tb.Helper()
	cpu, err := pgtest.ServerCPU(context.Background(), func(ctx context.Context) (pid int, err error) {
		err = pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)
		return pid, err
	})
	require.NoError(tb, err)
	return cpu
}

// BenchmarkAudit audits a workspace of n products whose events all landed
// (clean) and then with 10 records gone from the warehouse, the source on
// one PostgreSQL server and the local warehouse (the events table) on
// another, the warehouse's side through the real BigQuery client. Per
// audit it reports each server's CPU, the bytes each side sent and the
// queries asked, and beside them the floor: a count(*) of the same tables
// on each side, measured in the same run. Run with
//
//	go test -run='^$' -bench=Audit -benchtime=3x -timeout=60m ./shared/delivery/
func BenchmarkAudit(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) { benchAudit(b, n) })
	}
}

func benchAudit(b *testing.B, n int) {
	ctx := context.Background()
	sourceURL := pgtest.NewDatabase(b, &sdkfixture.V4Template)
	source, err := pgxpool.New(ctx, sourceURL)
	require.NoError(b, err)
	b.Cleanup(source.Close)
	_, err = sdkfixture.StartGeneration(ctx, source, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
	require.NoError(b, err)
	require.NoError(b, sdkfixture.BulkCreate(ctx, source, sdkfixture.Demo, "product", "title", n, 20_000))
	_, err = source.Exec(ctx, `UPDATE _ontology_replication_delivery SET accepted_at = now(), verified_at = now()`)
	require.NoError(b, err)

	// The warehouse on a server of its own, holding every event.
	other, err := pgtest.Start(ctx, pgtest.Config{})
	require.NoError(b, err)
	b.Cleanup(func() { _ = other.Stop() })
	whURL, err := other.CreateDatabase(ctx, "warehouse", "")
	require.NoError(b, err)
	wh, err := localwarehouse.Open(ctx, whURL)
	require.NoError(b, err)
	b.Cleanup(wh.Close)
	rows, err := source.Query(ctx, `SELECT id::text, replication->>'source_id', replication->>'generation', replication->>'entity_id',
	  replication->>'record_key', replication->>'record_kind', replication->>'schema_hash', (replication->>'revision')::numeric,
	  (replication->>'deleted')::boolean, replication->>'payload' FROM product_history WHERE replication IS NOT NULL`)
	require.NoError(b, err)
	copied, err := wh.Pool().CopyFrom(ctx, pgx.Identifier{"events"}, []string{"event_id", "source_id", "generation", "entity_id",
		"record_key", "record_kind", "schema_hash", "revision", "deleted", "payload"}, &rowsSource{rows: rows})
	require.NoError(b, err)
	require.EqualValues(b, n, copied)
	for _, db := range []*pgxpool.Pool{source, wh.Pool()} {
		_, err := db.Exec(ctx, "VACUUM ANALYZE")
		require.NoError(b, err)
	}

	bq := &countingHandler{h: bqserver.New(wh.QueryHandler())}
	bqHTTP := httptest.NewServer(bq)
	b.Cleanup(bqHTTP.Close)
	u, err := url.Parse(sourceURL)
	require.NoError(b, err)
	pg := countBytes(b, u.Host)
	u.Host = pg.ln.Addr().String()
	reg, err := registry.Parse([]byte(fmt.Sprintf(`{"workspaces": [{"id": "w1", "database": {"url": %q},
		"pubsub": {"project": "p1", "topic": "events"}, "bigquery": {"project": "p1", "endpoint": %q}}]}`, u.String(), bqHTTP.URL)))
	require.NoError(b, err)
	queries := &counter{}
	pools, err := database.New(database.Config{Tracer: queries})
	require.NoError(b, err)
	b.Cleanup(pools.Close)
	bqc, err := warehouse.NewBigQuery(warehouse.Config{})
	require.NoError(b, err)
	b.Cleanup(func() { _ = bqc.Close() })
	svc, err := delivery.New(delivery.Config{Registry: reg, Pools: pools, Publisher: noPublisher{}, Auditor: bqc,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(b, err)
	opts := delivery.AuditOptions{Entities: []string{"product"}}

	// The floor: count(*) of the same tables on each side.
	floor := func() (src, dst time.Duration) {
		s0 := cpuOf(b, source)
		var k int64
		require.NoError(b, source.QueryRow(ctx, `SELECT (SELECT count(*) FROM product_history) + (SELECT count(*) FROM _ontology_replication_baselines)`).Scan(&k))
		s1 := cpuOf(b, source)
		d0 := cpuOf(b, wh.Pool())
		require.NoError(b, wh.Pool().QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&k))
		return s1 - s0, cpuOf(b, wh.Pool()) - d0
	}

	for _, damaged := range []int{0, 10} {
		name := "clean"
		if damaged > 0 {
			name = "10_differences"
			_, err := wh.Pool().Exec(ctx, `DELETE FROM events WHERE record_key IN (SELECT record_key FROM events ORDER BY event_id LIMIT $1)`, damaged)
			require.NoError(b, err)
		}
		b.Run(name, func(b *testing.B) {
			var srcCPU, dstCPU, floorSrc, floorDst time.Duration
			var pgBytes, bqBytes, pgQueries int64
			var bqQueries int64
			for b.Loop() {
				fs, fd := floor()
				floorSrc, floorDst = floorSrc+fs, floorDst+fd
				s0, d0 := cpuOf(b, source), cpuOf(b, wh.Pool())
				pb, bb, q := pg.sent.Load(), bq.sent.Load(), queries.n.Load()
				rep, err := svc.Audit(ctx, "w1", opts)
				require.NoError(b, err)
				require.EqualValues(b, damaged, rep.Differences)
				srcCPU += cpuOf(b, source) - s0
				dstCPU += cpuOf(b, wh.Pool()) - d0
				pgBytes += pg.sent.Load() - pb
				bqBytes += bq.sent.Load() - bb
				pgQueries += queries.n.Load() - q
				bqQueries += 2
				if damaged == 0 {
					bqQueries--
				}
			}
			per := float64(b.N)
			b.ReportMetric(float64(srcCPU.Milliseconds())/per, "source_cpu_ms/op")
			b.ReportMetric(float64(dstCPU.Milliseconds())/per, "warehouse_cpu_ms/op")
			b.ReportMetric(float64(srcCPU)/float64(max(floorSrc, time.Millisecond)), "source_cpu/count")
			b.ReportMetric(float64(dstCPU)/float64(max(floorDst, time.Millisecond)), "warehouse_cpu/count")
			b.ReportMetric(float64(pgBytes)/per/1024, "source_KB/op")
			b.ReportMetric(float64(bqBytes)/per/1024, "warehouse_KB/op")
			b.ReportMetric(float64(pgQueries)/per, "source_roundtrips/op")
			b.ReportMetric(float64(bqQueries)/per, "bigquery_queries/op")
		})
	}
}

// rowsSource feeds pgx.Rows to CopyFrom.
type rowsSource struct {
	rows   pgx.Rows
	values []any
	err    error
}

func (r *rowsSource) Next() bool {
	if !r.rows.Next() {
		return false
	}
	r.values, r.err = r.rows.Values()
	return r.err == nil
}

func (r *rowsSource) Values() ([]any, error) { return r.values, r.err }
func (r *rowsSource) Err() error {
	if r.err != nil {
		return r.err
	}
	return r.rows.Err()
}

// noPublisher publishes nothing: an audit never publishes.
type noPublisher struct{}

func (noPublisher) Publish(context.Context, string, [][]byte) ([]string, error) {
	return nil, fmt.Errorf("an audit does not publish")
}
