package functions

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/logging"
	"github.com/segmentstream/ontology-replication/shared/publish"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
	"github.com/segmentstream/ontology-replication/shared/testbench/cloudsqlproxy"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgbouncer"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/testbench/tokenissuer"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// switchable is a pstest reactor that fails Publish while its error is set.
type switchable struct{ err atomic.Pointer[error] }

func (s *switchable) React(any) (bool, any, error) {
	if e := s.err.Load(); e != nil {
		return true, nil, *e
	}
	return false, nil, nil
}

func (s *switchable) set(err error) {
	if err == nil {
		s.err.Store(nil)
		return
	}
	s.err.Store(&err)
}

// workspaceDB is one workspace's SDK database.
type workspaceDB struct {
	id, org, subject string
	url              string
	pool             *pgxpool.Pool
	w                *sdkfixture.Writer
	gen              sdkfixture.Generation
}

// harness is a functions server over real parts: PostgreSQL, pstest, a
// local token issuer and an in-test BigQuery server.
type harness struct {
	t      *testing.T
	ctx    context.Context
	srv    *server
	pubsub *pstest.Server
	faults *switchable
	issuer *tokenissuer.Issuer
	bq     *bqserver.Server
	bqRows atomic.Pointer[bqserver.Handler]
	spaces map[string]*workspaceDB
	// cluster is the workspaces' cluster, when it is the test's own.
	cluster *pgtest.Cluster
	// cloudSQL is the stand-in instance the databases are reached through
	// (withCloudSQL).
	cloudSQL *cloudSQLHarness
	// pooler is the PgBouncer in front of the databases (withPooler).
	pooler  *pgbouncer.Server
	logs    *lockedWriter
	handler http.Handler
	// instance starts another instance of the functions over the same
	// workspaces (its own pools and stores), as Cloud Run does.
	instance func() http.Handler
	// servers are the instances started, the first one's (srv) first.
	servers []*server
}

type option_ func(*harnessConfig)

type harnessConfig struct {
	reactors   []pstest.ServerReactorOption
	intercept  grpc.UnaryClientInterceptor
	workspaces []string
	legacy     map[string]bool
	env        map[string]string
	// cluster holds the workspaces' databases; default: the shared one.
	cluster *pgtest.Cluster
	// lookupTimeout bounds one BigQuery lookup; default 3 s.
	lookupTimeout time.Duration
	// googleKeys fetches the keys of Google's tokens (withCallerCheck).
	googleKeys *http.Client
	// hosts, when set, spell the registry's database host of workspace i
	// as hosts[i % len(hosts)] (withHostSpellings).
	hosts []string
	// cloudSQL, when set, puts the workspaces' databases on a Cloud SQL
	// stand-in instance (withCloudSQL).
	cloudSQL *cloudsqlproxy.Config
	// pooled puts a PgBouncer (session mode) of the test's own in front of
	// the databases, the registry's entries pooled (withPooler).
	pooled bool
}

// withPooler reaches the workspaces' databases through a PgBouncer in
// session mode that the test starts, their registry entries pooled.
func withPooler() option_ { return func(c *harnessConfig) { c.pooled = true } }

// withHostSpellings has the registry name the workspaces' server by each
// of hosts in turn (127.0.0.1, localhost, [::1]: one server, three ways).
func withHostSpellings(hosts ...string) option_ {
	return func(c *harnessConfig) { c.hosts = hosts }
}

// withCallerCheck turns the verifier's caller check on: the scheduler's
// email and the audience, Google's keys fetched through client.
func withCallerCheck(email, audience string, client *http.Client) option_ {
	return func(c *harnessConfig) {
		delete(c.env, EnvVerifyCallerCheck)
		c.env[EnvVerifyCaller], c.env[EnvVerifyAudience] = email, audience
		c.googleKeys = client
	}
}

// withLookupTimeout bounds one BigQuery lookup, for tests whose
// BigQuery answers slowly on purpose.
func withLookupTimeout(d time.Duration) option_ {
	return func(c *harnessConfig) { c.lookupTimeout = d }
}

// withCluster puts the workspaces' databases on a cluster of the test's
// own.
func withCluster(c *pgtest.Cluster) option_ {
	return func(c_ *harnessConfig) { c_.cluster = c }
}

// withLegacy makes a workspace's database protocol 3.
func withLegacy(id string) option_ {
	return func(c *harnessConfig) { c.legacy[id] = true }
}

func withReactor(r pstest.ServerReactorOption) option_ {
	return func(c *harnessConfig) { c.reactors = append(c.reactors, r) }
}

func withInterceptor(f grpc.UnaryClientInterceptor) option_ {
	return func(c *harnessConfig) { c.intercept = f }
}

func withWorkspaces(ids ...string) option_ {
	return func(c *harnessConfig) { c.workspaces = ids }
}

func withEnv(k, v string) option_ {
	return func(c *harnessConfig) { c.env[k] = v }
}

func newHarness(t *testing.T, opts ...option_) *harness {
	t.Helper()
	// The caller check is off unless a test turns it on (withCallerCheck).
	cfg := harnessConfig{workspaces: []string{"w1"}, env: map[string]string{EnvVerifyCallerCheck: "off"}, legacy: map[string]bool{}}
	for _, o := range opts {
		o(&cfg)
	}
	h := &harness{t: t, ctx: context.Background(), faults: &switchable{}, spaces: map[string]*workspaceDB{}, logs: &lockedWriter{b: &strings.Builder{}}}
	h.pubsub = pstest.NewServer(append([]pstest.ServerReactorOption{{FuncName: "Publish", Reactor: h.faults}}, cfg.reactors...)...)
	t.Cleanup(func() { _ = h.pubsub.Close() })

	var err error
	h.issuer, err = tokenissuer.New("https://runtime.test", "key-1")
	require.NoError(t, err)
	jwks := httptest.NewServer(h.issuer)
	t.Cleanup(jwks.Close)

	h.bq = bqserver.New(func(ctx context.Context, q bqserver.Query) (bqserver.Result, error) {
		if f := h.bqRows.Load(); f != nil {
			return (*f)(ctx, q)
		}
		return h.landed(q)
	})
	bqHTTP := httptest.NewServer(h.bq)
	t.Cleanup(bqHTTP.Close)

	if cfg.cloudSQL != nil {
		h.cloudSQL = newCloudSQLHarness(t, cmp.Or(cfg.cluster, pgtest.Shared(t)), *cfg.cloudSQL)
	}
	var spaces []string
	if cfg.pooled {
		h.pooler = startPooler(t, cmp.Or(cfg.cluster, pgtest.Shared(t)))
	}
	for _, id := range cfg.workspaces {
		ws := &workspaceDB{id: id, org: "org-" + id, subject: "runtime-" + id}
		tpl := &sdkfixture.V4Template
		if cfg.legacy[id] {
			tpl = &sdkfixture.V3Template
		}
		if cfg.cluster != nil {
			ws.url = cfg.cluster.NewDatabase(t, tpl)
		} else {
			ws.url = pgtest.NewDatabase(t, tpl)
		}
		ws.pool, err = pgxpool.New(h.ctx, ws.url)
		require.NoError(t, err)
		t.Cleanup(ws.pool.Close)
		ws.w = sdkfixture.NewWriter(ws.pool, sdkfixture.Demo)
		ws.gen, err = sdkfixture.StartGeneration(h.ctx, ws.pool, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
		require.NoError(t, err)
		if cfg.cluster != nil {
			ws.pool.Reset() // a fleet's test connections do not add up
		}
		topic := "projects/p1/topics/events-" + id
		_, err = h.pubsub.GServer.CreateTopic(h.ctx, &pubsubpb.Topic{Name: topic})
		require.NoError(t, err)
		h.spaces[id] = ws
		dataset := "ds_" + id
		registryURL := ws.url
		if len(cfg.hosts) > 0 {
			registryURL = strings.Replace(ws.url, "@127.0.0.1:", "@"+cfg.hosts[len(spaces)%len(cfg.hosts)]+":", 1)
		}
		databaseJSON := fmt.Sprintf(`{"url": %q}`, registryURL)
		if h.pooler != nil {
			databaseJSON = fmt.Sprintf(`{"url": %q, "pooled": true}`, poolerURL(t, h.pooler, ws.url))
		}
		if h.cloudSQL != nil {
			databaseJSON = h.cloudSQL.database(h.ctx, ws, cmp.Or(cfg.cluster, pgtest.Shared(t)), cfg.legacy[id])
		}
		spaces = append(spaces, fmt.Sprintf(`{"id": %q, "organization_id": %q, "runtime_subject": %q,
			"database": %s, "pubsub": {"project": "p1", "topic": "events-%s"},
			"bigquery": {"project": "p1", "dataset": %q, "location": "EU", "endpoint": %q}}`, id, ws.org, ws.subject, databaseJSON, id, dataset, bqHTTP.URL))
	}
	cfg.env["REPLICATION_WORKSPACES"] = fmt.Sprintf(`{"identity": {"issuer": %q, "audience": "replication", "jwks_url": %q}, "workspaces": [%s]}`,
		h.issuer.URL, jwks.URL, strings.Join(spaces, ","))

	clientOpts := []option.ClientOption{
		option.WithEndpoint(h.pubsub.Addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
	}
	if cfg.intercept != nil {
		clientOpts = append(clientOpts, option.WithGRPCDialOption(grpc.WithUnaryInterceptor(cfg.intercept)))
	}
	pub, err := publish.New(h.ctx, publish.Config{Timeout: 5 * time.Second, Options: clientOpts})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	wh, err := warehouse.NewBigQuery(warehouse.Config{LookupTimeout: cmp.Or(cfg.lookupTimeout, 3*time.Second)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = wh.Close() })
	log := logging.New(h.logs, logging.Config{Level: slog.LevelDebug, ProjectID: "p1", Service: "replication-test"})
	h.instance = func() http.Handler {
		opening := func(c *delivery.OpenConfig) {
			c.Warehouse = wh
			if h.cloudSQL != nil {
				c.Pools.DialerOptions = h.cloudSQL.inst.DialerOptions(cloudSQLToken)
			}
		}
		srv, err := newServer(h.ctx, func(k string) string { return cfg.env[k] }, dependencies{publisher: pub, opening: opening, logger: log, googleKeys: cfg.googleKeys})
		require.NoError(t, err)
		t.Cleanup(srv.close)
		if h.srv == nil {
			h.srv = srv
		}
		h.servers = append(h.servers, srv)
		mux := http.NewServeMux()
		mux.HandleFunc("/Verify", srv.serveVerify)
		mux.HandleFunc("/", srv.serveDrain)
		return mux
	}
	h.handler = h.instance()
	return h
}

// token signs a runtime token for the workspace.
func (h *harness) token(subject string) string {
	tok, err := h.issuer.Token(subject, "replication", time.Minute)
	require.NoError(h.t, err)
	return tok
}

// wake calls the drain as the SDK does, returning status and decoded body.
func (h *harness) wake(workspace string) (int, map[string]any) {
	ws := h.spaces[workspace]
	return h.call(http.MethodPost, "/api/internal/v1/workspaces/"+workspace+"/ontology/replication/drain", h.token(ws.subject), ws.org)
}

func (h *harness) call(method, path, token, org string) (int, map[string]any) {
	return h.callOn(h.handler, method, path, token, org)
}

// wakeOn wakes the drain of another instance.
func (h *harness) wakeOn(handler http.Handler, workspace string) (int, map[string]any) {
	ws := h.spaces[workspace]
	return h.callOn(handler, http.MethodPost, "/api/internal/v1/workspaces/"+workspace+"/ontology/replication/drain", h.token(ws.subject), ws.org)
}

func (h *harness) callOn(handler http.Handler, method, path, token, org string) (int, map[string]any) {
	req := httptest.NewRequest(method, path, nil)
	if token != "" {
		req.Header.Set(headerIdentity, token)
	}
	if org != "" {
		req.Header.Set(headerOrganization, org)
	}
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, req)
	var body map[string]any
	raw, _ := io.ReadAll(rec.Body)
	require.NoError(h.t, json.Unmarshal(raw, &body), "body %s", raw)
	return rec.Code, body
}

// verify calls the Verify function.
func (h *harness) verify(body string) (int, delivery.VerifyPass) {
	req := httptest.NewRequest(http.MethodPost, "/Verify", strings.NewReader(body))
	rec := httptest.NewRecorder()
	h.handler.ServeHTTP(rec, req)
	var resp delivery.VerifyPass
	require.NoError(h.t, json.Unmarshal(rec.Body.Bytes(), &resp), "body %s", rec.Body.String())
	return rec.Code, resp
}

// verifyRaw calls the Verify function and returns the raw answer.
func (h *harness) verifyRaw(body string) (int, string) {
	req := httptest.NewRequest(http.MethodPost, "/Verify", strings.NewReader(body))
	rec := httptest.NewRecorder()
	h.handler.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// published returns the events Pub/Sub holds for a workspace's topic.
func (h *harness) published(workspace string) []event.Event {
	var out []event.Event
	for _, m := range h.pubsub.Messages() {
		if m.Topic != "projects/p1/topics/events-"+workspace {
			continue
		}
		var e event.Event
		require.NoError(h.t, json.Unmarshal(m.Data, &e))
		out = append(out, e)
	}
	return out
}

// landed answers a lookup from what Pub/Sub holds, as a BigQuery
// subscription would have written it.
func (h *harness) landed(q bqserver.Query) (bqserver.Result, error) {
	ids, gens := q.Params["ids"], q.Params["generations"].Values
	held := map[string]bool{}
	for _, m := range h.pubsub.Messages() {
		var e event.Event
		if json.Unmarshal(m.Data, &e) == nil && slices.Contains(gens, e.Generation) {
			held[e.EventID] = true
		}
	}
	var present []string
	for _, id := range ids.Values {
		if held[id] {
			present = append(present, id)
		}
	}
	return bqserver.Strings("event_id", present), nil
}

func (h *harness) count(workspace, query string, args ...any) int64 {
	var n int64
	require.NoError(h.t, h.spaces[workspace].pool.QueryRow(h.ctx, query, args...).Scan(&n))
	return n
}

func (h *harness) products(workspace string, n int) {
	require.NoError(h.t, sdkfixture.BulkCreate(h.ctx, h.spaces[workspace].pool, sdkfixture.Demo, "product", "title", n, 1000))
}
