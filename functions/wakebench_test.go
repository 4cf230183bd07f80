package functions

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
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

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/publish"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgbouncer"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/testbench/tokenissuer"
)

// wakeBench is the wake-up path as the SDK drives it, on a PostgreSQL
// server of its own (with pg_stat_statements): N workspace databases,
// each with its SDK writers' connection (application_name sdk-writer) and
// a runtime token, and four instances of the drain served over HTTP
// (newServer, each its own pools and drainers, as Cloud Run's instances),
// whose sessions log in as the role drainer, directly or through a
// PgBouncer of the bench's own (pooled). Pub/Sub is pstest, each Publish
// delayed by publishDelay in the drain's own client (a slow Pub/Sub that
// takes requests side by side).
type wakeBench struct {
	ctx       context.Context
	cluster   *pgtest.Cluster
	admin     *pgxpool.Pool // the postgres database, as the superuser
	spaces    []*benchSpace
	instances []*httptest.Server
	servers   []*server
	pooler    *pgbouncer.Server
	delay     *atomic.Int64 // each Publish's delay, in nanoseconds
	gather    time.Duration // the drain's DRAIN_GATHER, and the floor's interval
}

// benchSpace is one workspace of the bench.
type benchSpace struct {
	id, org, db string
	writer      *pgxpool.Pool // one connection: the SDK's, warm
	w           *sdkfixture.Writer
	gen         string
	token       string
	floor       *pgx.Conn // the floor's warm connection (floor runs only)
}

// wakeBenchConfig is a bench's shape.
type wakeBenchConfig struct {
	workspaces int
	pooled     bool
	floor      bool // open the floor's connections
	env        map[string]string
}

func newWakeBench(b *testing.B, cfg wakeBenchConfig) *wakeBench {
	b.Helper()
	ctx := context.Background()
	conns := 3*cfg.workspaces + 200
	settings := map[string]string{"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all",
		"pg_stat_statements.track_planning": "on", "max_connections": strconv.Itoa(conns), "autovacuum_naptime": "10s"}
	if cfg.workspaces > 50 {
		// Autovacuum visits every database each naptime, each visit a
		// worker process that ends between samples, whose CPU the bench
		// would count as the drain's (pgtest.Ended): off on a fleet.
		settings["autovacuum"] = "off"
	}
	cluster, err := pgtest.Start(ctx, pgtest.Config{Disposable: true, Settings: settings})
	require.NoError(b, err)
	b.Cleanup(func() { _ = cluster.Stop() })
	wb := &wakeBench{ctx: ctx, cluster: cluster, delay: &atomic.Int64{}, gather: delivery.DefaultGather}
	if v := os.Getenv("REPLICATION_WAKEUP_GATHER"); v != "" {
		wb.gather, err = time.ParseDuration(v)
		require.NoError(b, err, "REPLICATION_WAKEUP_GATHER")
	}
	wb.admin, err = pgxpool.New(ctx, cluster.AdminURL())
	require.NoError(b, err)
	b.Cleanup(wb.admin.Close)
	require.NoError(b, cluster.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`,
		`CREATE ROLE drainer SUPERUSER LOGIN PASSWORD 'drainer'`, `CREATE ROLE floor SUPERUSER LOGIN PASSWORD 'floor'`))

	issuer, err := tokenissuer.New("https://runtime.bench", "key-1")
	require.NoError(b, err)
	jwks := httptest.NewServer(issuer)
	b.Cleanup(jwks.Close)
	ps := pstest.NewServer()
	b.Cleanup(func() { _ = ps.Close() })
	if cfg.pooled {
		wb.pooler, err = pgbouncer.Start(ctx, pgbouncer.Config{Server: fmt.Sprintf("127.0.0.1:%d", cluster.Port()),
			Users:    map[string]string{"drainer": "drainer"},
			Settings: map[string]string{"default_pool_size": "2", "server_idle_timeout": "60", "log_disconnections": "1"}})
		require.NoError(b, err)
		b.Cleanup(func() { _ = wb.pooler.Stop() })
	}
	wb.spaces = make([]*benchSpace, cfg.workspaces)
	var entries []string
	var mu sync.Mutex
	work := make(chan int)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range work {
				sp := wb.newSpace(b, i, issuer, cfg.floor)
				dbURL := fmt.Sprintf("postgres://drainer:drainer@127.0.0.1:%d/%s?sslmode=disable", cluster.Port(), sp.db)
				pooled := ""
				if wb.pooler != nil {
					dbURL, pooled = wb.pooler.URL("drainer", "drainer", sp.db), `, "pooled": true`
				}
				_, err := ps.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/p1/topics/events-" + sp.id})
				require.NoError(b, err)
				mu.Lock()
				wb.spaces[i] = sp
				entries = append(entries, fmt.Sprintf(`{"id": %q, "organization_id": %q, "runtime_subject": %q, "database": {"url": %q%s},
					"pubsub": {"project": "p1", "topic": "events-%s"}, "bigquery": {"project": "p1"}}`, sp.id, sp.org, "runtime-"+sp.id, dbURL, pooled, sp.id))
				mu.Unlock()
			}
		})
	}
	for i := range cfg.workspaces {
		work <- i
	}
	close(work)
	wg.Wait()
	env := map[string]string{
		"REPLICATION_WORKSPACES": fmt.Sprintf(`{"identity": {"issuer": %q, "audience": "replication", "jwks_url": %q}, "workspaces": [%s]}`,
			issuer.URL, jwks.URL, strings.Join(entries, ",")),
		EnvVerifyCallerCheck: "off",
		"DRAIN_GATHER":       wb.gather.String(),
	}
	for k, v := range cfg.env {
		env[k] = v
	}
	pub, err := publish.New(ctx, publish.Config{EmulatorHost: ps.Addr})
	require.NoError(b, err)
	b.Cleanup(func() { _ = pub.Close() })
	delayed := &delayedPublisher{Publisher: pub, delay: wb.delay}
	for range 4 {
		srv, err := newServer(ctx, func(k string) string { return env[k] }, dependencies{publisher: delayed, logger: slog.New(slog.DiscardHandler)})
		require.NoError(b, err)
		b.Cleanup(srv.close)
		mux := http.NewServeMux()
		mux.HandleFunc("/", srv.serveDrain)
		hs := httptest.NewServer(mux)
		b.Cleanup(hs.Close)
		wb.servers = append(wb.servers, srv)
		wb.instances = append(wb.instances, hs)
	}
	return wb
}

// newSpace makes workspace i: its database, generation, SDK writer and
// token (and the floor's connection).
func (wb *wakeBench) newSpace(b *testing.B, i int, issuer *tokenissuer.Issuer, floor bool) *benchSpace {
	url := wb.cluster.NewDatabase(b, &sdkfixture.V4Template)
	sp := &benchSpace{id: fmt.Sprintf("w%04d", i), org: fmt.Sprintf("org-%04d", i)}
	sp.db = url[strings.LastIndexByte(url, '/')+1:]
	if q := strings.IndexByte(sp.db, '?'); q >= 0 {
		sp.db = sp.db[:q]
	}
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(b, err)
	cfg.MaxConns, cfg.MinConns = 1, 1
	cfg.ConnConfig.RuntimeParams["application_name"] = "sdk-writer"
	sp.writer, err = pgxpool.NewWithConfig(wb.ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(sp.writer.Close)
	g, err := sdkfixture.StartGeneration(wb.ctx, sp.writer, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
	require.NoError(b, err)
	sp.gen, sp.w = g.Generation, sdkfixture.NewWriter(sp.writer, sdkfixture.Demo)
	sp.token, err = issuer.Token("runtime-"+sp.id, "replication", 24*time.Hour)
	require.NoError(b, err)
	if floor {
		fcfg, err := pgx.ParseConfig(fmt.Sprintf("postgres://floor:floor@127.0.0.1:%d/%s?sslmode=disable&application_name=floor", wb.cluster.Port(), sp.db))
		require.NoError(b, err)
		sp.floor, err = pgx.ConnectConfig(wb.ctx, fcfg)
		require.NoError(b, err)
		b.Cleanup(func() { _ = sp.floor.Close(context.Background()) })
	}
	return sp
}

// delayedPublisher delays each Publish: a slow Pub/Sub, whose requests
// still go side by side.
type delayedPublisher struct {
	delivery.Publisher
	delay *atomic.Int64
}

func (p *delayedPublisher) Publish(ctx context.Context, topic string, data [][]byte) ([]string, error) {
	if d := time.Duration(p.delay.Load()); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	return p.Publisher.Publish(ctx, topic, data)
}

// benchEnvInt reads an integer setting of the bench's environment.
func benchEnvInt(b *testing.B, name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(b, err, name)
		return n
	}
	return def
}
