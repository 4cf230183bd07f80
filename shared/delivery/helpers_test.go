package delivery_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
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
	"github.com/segmentstream/ontology-replication/shared/deadletter"
	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/publish"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
	"github.com/segmentstream/ontology-replication/shared/testbench/localwarehouse"
	"github.com/segmentstream/ontology-replication/shared/testbench/logbuf"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// rig is a workspace over real parts: an SDK database at protocol 4 with
// an active generation, pstest, the BigQuery client against an in-test
// server, and a Service over them.
type rig struct {
	ctx  context.Context
	url  string
	pool *pgxpool.Pool // the SDK's side: fixtures, writers, checks
	srv  *pstest.Server
	svc  *delivery.Service
	bq   *bqserver.Server
	gen  sdkfixture.Generation
	w    *sdkfixture.Writer
	// queries counts the service's round trips to PostgreSQL.
	queries *counter
	// newService builds another Service over the same parts (another
	// instance).
	newService func() *delivery.Service

	mu      sync.Mutex
	missing map[string]bool // event ids BigQuery does not hold
	// lookup, when set, answers BigQuery's lookups in place of the
	// config's present or r.missing (see answer).
	lookup atomic.Pointer[bqserver.Handler]
	// wh, with withLocalWarehouse, is the warehouse every BigQuery query
	// is answered from; land writes to it what Pub/Sub holds (see
	// warehouse_test.go).
	wh *localwarehouse.Local
	// landed is what land wrote; afterRecordsRead runs after the
	// warehouse answered an audit's records query (the moment between an
	// audit's read of the warehouse and its read of the source).
	landed           map[string]bool
	afterRecordsRead func()
}

// rigOption changes a rig.
type rigOption func(*rigConfig)

type rigConfig struct {
	reactors []pstest.ServerReactorOption
	store    store.Config
	// publisher wraps the rig's publisher (nil: as it is).
	publisher func(delivery.Publisher) delivery.Publisher
	// present answers BigQuery's lookups (nil: every id but r.missing).
	present func(ids []string) []string
	// service changes each Service's config.
	service func(*delivery.Config)
	// template is the SDK database's (nil: protocol 4).
	template *pgtest.Template
	// localWarehouse answers every BigQuery query from a local warehouse.
	localWarehouse bool
	// publishTimeout bounds each Publish RPC (0: the publisher's default).
	publishTimeout time.Duration
}

// withPublishTimeout bounds each Publish RPC of the rig's publisher.
func withPublishTimeout(d time.Duration) rigOption {
	return func(c *rigConfig) { c.publishTimeout = d }
}

// withService changes the config of every Service of the rig.
func withService(change func(*delivery.Config)) rigOption {
	return func(c *rigConfig) { c.service = change }
}

// withPublisher wraps the publisher every Service of the rig uses (after
// the wraps of earlier options).
func withPublisher(wrap func(delivery.Publisher) delivery.Publisher) rigOption {
	return func(c *rigConfig) {
		prev := c.publisher
		c.publisher = func(p delivery.Publisher) delivery.Publisher {
			if prev != nil {
				p = prev(p)
			}
			return wrap(p)
		}
	}
}

// withGate holds every Publish of the rig's Services at g while g holds,
// before the request is sent (pstest serialises its reactors, so a gate
// there would hold the requests behind the first too).
func withGate(g *gate) rigOption {
	return withPublisher(func(p delivery.Publisher) delivery.Publisher { return &gatedPublisher{Publisher: p, g: g} })
}

// gatedPublisher waits at its gate before each Publish while it holds.
type gatedPublisher struct {
	delivery.Publisher
	g *gate
}

func (p *gatedPublisher) Publish(ctx context.Context, topic string, data [][]byte) ([]string, error) {
	if p.g.held.Load() {
		p.g.entered <- struct{}{}
		select {
		case <-p.g.open:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return p.Publisher.Publish(ctx, topic, data)
}

// withPresent makes BigQuery hold exactly the events present returns.
func withPresent(present func(ids []string) []string) rigOption {
	return func(c *rigConfig) { c.present = present }
}

// withPublishReactor sees every Publish request before pstest.
func withPublishReactor(r pstest.Reactor) rigOption {
	return func(c *rigConfig) {
		c.reactors = append(c.reactors, pstest.ServerReactorOption{FuncName: "Publish", Reactor: r})
	}
}

func withStore(cfg store.Config) rigOption { return func(c *rigConfig) { c.store = cfg } }

// withTemplate builds the SDK database from tpl (sdkfixture.V3Template for
// a protocol 3 database).
func withTemplate(tpl *pgtest.Template) rigOption { return func(c *rigConfig) { c.template = tpl } }

// counter counts the queries sent to PostgreSQL: one round trip each
// (BEGIN and COMMIT included).
type counter struct{ n atomic.Int64 }

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A pipelined batch is one round trip.
func (c *counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func newRig(tb testing.TB, maxConns int, opts ...rigOption) *rig {
	tb.Helper()
	var cfg rigConfig
	for _, o := range opts {
		o(&cfg)
	}
	ctx := context.Background()
	tpl := &sdkfixture.V4Template
	if cfg.template != nil {
		tpl = cfg.template
	}
	url := pgtest.NewDatabase(tb, tpl)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	gen, err := sdkfixture.StartGeneration(ctx, pool, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
	require.NoError(tb, err)
	srv := pstest.NewServer(cfg.reactors...)
	tb.Cleanup(func() { _ = srv.Close() })
	_, err = srv.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/p1/topics/events"})
	require.NoError(tb, err)
	pub, err := publish.New(ctx, publish.Config{EmulatorHost: srv.Addr, Timeout: cfg.publishTimeout})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = pub.Close() })
	deadLetters, err := deadletter.New(ctx, deadletter.Config{Project: "p1", EmulatorHost: srv.Addr})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = deadLetters.Close() })
	r := &rig{ctx: ctx, url: url, pool: pool, srv: srv, gen: gen, w: sdkfixture.NewWriter(pool, sdkfixture.Demo)}
	if cfg.localWarehouse {
		r.openLocalWarehouse(tb)
	}
	r.bq = bqserver.New(func(ctx context.Context, q bqserver.Query) (bqserver.Result, error) {
		if f := r.lookup.Load(); f != nil {
			return (*f)(ctx, q)
		}
		if r.wh != nil {
			return r.fromLocalWarehouse(ctx, q)
		}
		if cfg.present != nil {
			return bqserver.Strings("event_id", cfg.present(q.Params["ids"].Values)), nil
		}
		// Everything landed but the events the test says did not.
		r.mu.Lock()
		defer r.mu.Unlock()
		var present []string
		for _, id := range q.Params["ids"].Values {
			if !r.missing[id] {
				present = append(present, id)
			}
		}
		return bqserver.Strings("event_id", present), nil
	})
	bqHTTP := httptest.NewServer(r.bq)
	tb.Cleanup(bqHTTP.Close)
	reg, err := registry.Parse([]byte(fmt.Sprintf(`{"workspaces": [{"id": "w1", "database": {"url": %q, "max_conns": %d},
		"pubsub": {"project": "p1", "topic": "events"}, "bigquery": {"project": "p1", "endpoint": %q}}]}`, url, maxConns, bqHTTP.URL)))
	require.NoError(tb, err)
	r.queries = &counter{}
	wh, err := warehouse.NewBigQuery(warehouse.Config{})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = wh.Close() })
	var publisher delivery.Publisher = pub
	if cfg.publisher != nil {
		publisher = cfg.publisher(pub)
	}
	r.newService = func() *delivery.Service {
		pools, err := database.New(database.Config{Tracer: r.queries})
		require.NoError(tb, err)
		tb.Cleanup(func() { closePools(tb, r, pools) })
		scfg := delivery.Config{Registry: reg, Pools: pools, Publisher: publisher, Warehouse: wh, Auditor: wh, DeadLetters: deadLetters, Store: cfg.store,
			Logger: testLogger()}
		if cfg.service != nil {
			cfg.service(&scfg)
		}
		svc, err := delivery.New(scfg)
		require.NoError(tb, err)
		// Before its pools close (cleanups run last first): its drainers
		// end, their batches out published and acknowledged.
		tb.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := svc.Shutdown(ctx); err != nil {
				tb.Errorf("the drainers did not end within 30 s: %v", err)
			}
		})
		return svc
	}
	r.svc = r.newService()
	return r
}

func (r *rig) count(tb testing.TB, query string, args ...any) int64 {
	tb.Helper()
	var n int64
	require.NoError(tb, r.pool.QueryRow(r.ctx, query, args...).Scan(&n))
	return n
}

// gate holds Publish requests while closed (withGate): a publish then
// takes as long as the test needs. Entered is signalled when a request is
// held.
type gate struct {
	held    atomic.Bool
	entered chan struct{}
	open    chan struct{}
	once    sync.Once
}

func newGate() *gate { return &gate{entered: make(chan struct{}, 100), open: make(chan struct{})} }

func (g *gate) hold() { g.held.Store(true) }

// wake wakes svc's drainer of w1, as the drain function does for the
// SDK's wake-up: it answers at once, the drainer working behind it.
func (r *rig) wake(tb testing.TB, svc *delivery.Service) (delivery.WakeAnswer, error) {
	tb.Helper()
	ws, err := svc.Workspace("w1")
	require.NoError(tb, err)
	return svc.Wake(r.ctx, ws)
}

// wakeOK wakes svc's drainer of w1 and requires its promise.
func (r *rig) wakeOK(tb testing.TB, svc *delivery.Service) delivery.WakeAnswer {
	tb.Helper()
	ans, err := r.wake(tb, svc)
	require.NoError(tb, err)
	require.True(tb, ans.Promised, "%+v", ans)
	return ans
}

// settle waits, a minute at most, until none of svcs (r.svc when none is
// given) runs a drainer: every wake-up they answered has been carried out.
func (r *rig) settle(tb testing.TB, svcs ...*delivery.Service) {
	tb.Helper()
	if len(svcs) == 0 {
		svcs = []*delivery.Service{r.svc}
	}
	ctx, cancel := context.WithTimeout(r.ctx, time.Minute)
	defer cancel()
	for _, svc := range svcs {
		require.NoError(tb, svc.Idle(ctx), "a drainer still runs after a minute")
	}
}

// drainHeld wakes r.svc's drainer while the gate holds publishes, and
// returns once its batch is out (a minute at most).
func (r *rig) drainHeld(tb testing.TB, g *gate) {
	tb.Helper()
	g.hold()
	r.wakeOK(tb, r.svc)
	await.Receive(tb, g.entered, "the batch's publish")
}

// newRigWithABatchOut is a rig (batches of 2) whose drainer has one batch
// out, a product titled title, its publish held at the gate.
func newRigWithABatchOut(t *testing.T, title string) (*rig, *gate) {
	t.Helper()
	g := newGate()
	r := newRig(t, 2, withGate(g))
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": title})
	require.NoError(t, err)
	r.drainHeld(t, g)
	return r, g
}

// release lets every held request, and every later one, through.
func (g *gate) release() {
	g.held.Store(false)
	g.once.Do(func() { close(g.open) })
}

// closePools closes a Service's pools when the test ends, once every
// connection was given back and no lock of the drain's turns or claims is
// held in the rig's database; otherwise (a turn or a claim that leaked its
// connection) it fails the test naming that, instead of hanging in
// pgxpool.Close until the package's time-out.
func closePools(tb testing.TB, r *rig, pools *database.Pools) {
	deadline := time.Now().Add(10 * time.Second)
	acquired := func() int {
		n := 0
		for _, st := range pools.Stats() {
			n += st.Acquired
		}
		return n
	}
	for acquired() > 0 {
		if time.Now().After(deadline) {
			tb.Errorf("%d connections were never given back (a turn, a claim or a session not ended); %d locks of the turns and claims held",
				acquired(), r.drainLocksHeld(tb))
			return // left open: closing would wait for them forever
		}
		time.Sleep(10 * time.Millisecond) // the pools' own count is the signal
	}
	pools.Close()
}

// drainLocksHeld counts the advisory locks of the drain's turns and claims
// held in the rig's database.
func (r *rig) drainLocksHeld(tb testing.TB) int64 {
	return r.count(tb, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
		AND classid::int IN (hashtext($1), hashtext($2)) AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		store.DrainTurnClass, store.ClaimLockClass)
}

// awaitLogged waits, a minute at most, until logs has a line containing
// message (the product's own signal); the test fails if the work that
// should log it ends first (done: what it returned is printed) or the
// minute passes.
func awaitLogged[T any](t testing.TB, logs *logbuf.Buffer, message string, done <-chan T, what string) {
	t.Helper()
	deadline := time.After(time.Minute)
	for !strings.Contains(logs.String(), message) {
		select {
		case v := <-done:
			t.Fatalf("%s ended before it logged %q: %+v", what, message, v)
		case <-deadline:
			t.Fatalf("%s did not log %q within a minute", what, message)
		case <-time.After(5 * time.Millisecond): // polling the log: the signal itself
		}
	}
}

// testLogger is the rig's services' logger: nothing, unless
// REPLICATION_TEST_LOG is set (then DEBUG on stderr).
func testLogger() *slog.Logger {
	if os.Getenv("REPLICATION_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
