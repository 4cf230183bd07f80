package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/segmentstream/ontology-replication/shared/testbench/logbuf"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
	"github.com/segmentstream/ontology-replication/shared/testbench/localwarehouse"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type space struct {
	id   string
	url  string
	pool *pgxpool.Pool
	w    *sdkfixture.Writer
}

// harness runs the job against real PostgreSQL databases, a pstest Pub/Sub
// server (as PUBSUB_EMULATOR_HOST) and an in-test BigQuery server.
type harness struct {
	t      testing.TB
	ctx    context.Context
	pubsub *pstest.Server
	bq     *bqserver.Server
	bqURL  string // the BigQuery server's endpoint
	mu     sync.Mutex
	ddl    []string
	spaces map[string]*space
	env    map[string]string
	// onPublish, when set, sees every publish request before pstest
	// handles it (to cut a run at an exact point of its drain); an error
	// it returns is Pub/Sub's answer.
	onPublish func(*pubsubpb.PublishRequest) error
	// hidden are event ids BigQuery answers as absent though Pub/Sub
	// holds them.
	hidden map[string]bool
	// wh, when set (withWarehouse), is the BigQuery stand-in every query
	// is answered from: the lookups find what landed in it.
	wh     *localwarehouse.Local
	landed map[string]bool // the Pub/Sub messages written to wh
	// decoded caches the event id of each message body published, filled
	// as publish requests arrive (publishHook), so that a lookup decodes
	// nothing on a busy machine: a replay of 20,000 events leaves 40,000
	// messages to answer from, too many to decode within a lookup's 20 s.
	decodedMu sync.Mutex
	decoded   map[string]string
}

// eventIDOf returns the event id a message body carries (cached by body).
func (h *harness) eventIDOf(data []byte) string {
	h.decodedMu.Lock()
	defer h.decodedMu.Unlock()
	if id, ok := h.decoded[string(data)]; ok {
		return id
	}
	var e struct {
		EventID string `json:"event_id"`
	}
	_ = json.Unmarshal(data, &e)
	if h.decoded == nil {
		h.decoded = map[string]string{}
	}
	h.decoded[string(data)] = e.EventID
	return e.EventID
}

// hide makes BigQuery answer the given events as absent (none: every
// published event is there again).
func (h *harness) hide(ids ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hidden = map[string]bool{}
	for _, id := range ids {
		h.hidden[id] = true
	}
}

// publishHook lets a test watch publish requests as pstest receives them.
type publishHook struct{ h *harness }

// React calls the harness's onPublish and leaves the request to pstest.
func (p publishHook) React(req any) (bool, any, error) {
	p.h.mu.Lock()
	f := p.h.onPublish
	p.h.mu.Unlock()
	r, ok := req.(*pubsubpb.PublishRequest)
	if !ok {
		return false, nil, nil
	}
	if f != nil {
		if err := f(r); err != nil {
			return true, nil, err
		}
	}
	for _, m := range r.Messages {
		p.h.eventIDOf(m.Data) // decoded now, not in a lookup
	}
	return false, nil, nil
}

// newHarness makes one workspace per template (w1, w2, …) on the shared
// cluster.
func newHarness(t testing.TB, templates ...*pgtest.Template) *harness {
	t.Helper()
	return newHarnessOn(t, pgtest.Shared(t), templates...)
}

// newHarnessOn makes one workspace per template on cluster c.
func newHarnessOn(t testing.TB, c *pgtest.Cluster, templates ...*pgtest.Template) *harness {
	t.Helper()
	h := &harness{t: t, ctx: context.Background(), spaces: map[string]*space{}, env: map[string]string{}}
	h.pubsub = pstest.NewServer(pstest.ServerReactorOption{FuncName: "Publish", Reactor: publishHook{h}})
	t.Cleanup(func() { _ = h.pubsub.Close() })
	h.bq = bqserver.New(func(ctx context.Context, q bqserver.Query) (bqserver.Result, error) {
		if strings.HasPrefix(q.SQL, "CREATE OR REPLACE VIEW") {
			h.mu.Lock()
			h.ddl = append(h.ddl, q.SQL)
			h.mu.Unlock()
			return bqserver.Result{}, nil
		}
		h.mu.Lock()
		wh := h.wh
		h.mu.Unlock()
		if wh != nil {
			return wh.QueryHandler()(ctx, q)
		}
		return h.present(q), nil
	})
	bqHTTP := httptest.NewServer(h.bq)
	t.Cleanup(bqHTTP.Close)
	h.bqURL = bqHTTP.URL
	var entries []string
	for i, tpl := range templates {
		id := fmt.Sprintf("w%d", i+1)
		s := &space{id: id, url: c.NewDatabase(t, tpl)}
		var err error
		s.pool, err = pgxpool.New(h.ctx, s.url)
		require.NoError(t, err)
		t.Cleanup(s.pool.Close)
		s.w = sdkfixture.NewWriter(s.pool, sdkfixture.Demo)
		_, err = h.pubsub.GServer.CreateTopic(h.ctx, &pubsubpb.Topic{Name: "projects/p1/topics/events-" + id})
		require.NoError(t, err)
		// The dead-letter topic and subscription, as terraform names them.
		_, err = h.pubsub.GServer.CreateTopic(h.ctx, &pubsubpb.Topic{Name: "projects/p1/topics/events-" + id + "-dead-letter"})
		require.NoError(t, err)
		_, err = h.pubsub.GServer.CreateSubscription(h.ctx, &pubsubpb.Subscription{Name: "projects/p1/subscriptions/events-" + id + "-dead-letter",
			Topic: "projects/p1/topics/events-" + id + "-dead-letter", AckDeadlineSeconds: 60})
		require.NoError(t, err)
		h.spaces[id] = s
		entries = append(entries, fmt.Sprintf(`{"id": %q, "database": {"url": %q}, "pubsub": {"project": "p1", "topic": "events-%s"},
			"bigquery": {"project": "p1", "location": "EU", "endpoint": %q}}`, id, s.url, id, bqHTTP.URL))
	}
	h.env["REPLICATION_WORKSPACES"] = `{"workspaces": [` + strings.Join(entries, ",") + `]}`
	h.env["PUBSUB_EMULATOR_HOST"] = h.pubsub.Addr
	return h
}

// start starts a generation in a workspace.
func (h *harness) start(id string) sdkfixture.Generation {
	g, err := sdkfixture.StartGeneration(h.ctx, h.spaces[id].pool, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
	require.NoError(h.t, err)
	return g
}

// run runs the job with the harness's environment.
func (h *harness) run(ctx context.Context, args ...string) (string, string, error) {
	return h.runEnv(ctx, nil, args...)
}

// runEnv runs the job with the harness's environment, some variables
// replaced.
func (h *harness) runEnv(ctx context.Context, replace map[string]string, args ...string) (string, string, error) {
	var stdout, stderr bytes.Buffer
	getenv := func(k string) string {
		if v, ok := replace[k]; ok {
			return v
		}
		return h.env[k]
	}
	err := run(ctx, args, getenv, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

func (h *harness) mustRun(args ...string) string {
	h.t.Helper()
	out, logs, err := h.run(h.ctx, args...)
	require.NoError(h.t, err, "job %v failed; logs:\n%s", args, logs)
	return out
}

// published returns the event ids in a workspace's topic with their counts.
func (h *harness) published(id string) map[string]int {
	out := map[string]int{}
	for _, m := range h.pubsub.Messages() {
		if m.Topic != "projects/p1/topics/events-"+id {
			continue
		}
		var e event.Event
		require.NoError(h.t, json.Unmarshal(m.Data, &e))
		out[e.EventID]++
	}
	return out
}

// withWarehouse makes a local warehouse (a PostgreSQL events table) the
// BigQuery that every query is answered from; land writes to it what
// Pub/Sub holds.
func (h *harness) withWarehouse() *localwarehouse.Local {
	h.t.Helper()
	wh, err := localwarehouse.Open(h.ctx, pgtest.NewDatabase(h.t, nil))
	require.NoError(h.t, err)
	h.t.Cleanup(wh.Close)
	h.mu.Lock()
	h.wh, h.landed = wh, map[string]bool{}
	h.mu.Unlock()
	return wh
}

// land writes the messages Pub/Sub holds that the local warehouse has not
// received yet, as a BigQuery subscription would.
func (h *harness) land() {
	h.t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	var batch [][]byte
	for _, m := range h.pubsub.Messages() {
		if !h.landed[m.ID] {
			h.landed[m.ID] = true
			batch = append(batch, m.Data)
		}
	}
	if len(batch) > 0 {
		require.NoError(h.t, h.wh.Ingest(h.ctx, batch))
	}
}

// present answers lookups with what Pub/Sub holds.
func (h *harness) present(q bqserver.Query) bqserver.Result {
	held := map[string]bool{}
	for _, m := range h.pubsub.Messages() {
		if id := h.eventIDOf(m.Data); id != "" {
			held[id] = true
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var present []string
	for _, id := range q.Params["ids"].Values {
		if held[id] && !h.hidden[id] {
			present = append(present, id)
		}
	}
	return bqserver.Strings("event_id", present)
}

func (h *harness) count(id, query string, args ...any) int64 {
	h.t.Helper()
	var n int64
	require.NoError(h.t, h.spaces[id].pool.QueryRow(h.ctx, query, args...).Scan(&n))
	return n
}

func (h *harness) products(id string, n int) {
	require.NoError(h.t, sdkfixture.BulkCreate(h.ctx, h.spaces[id].pool, sdkfixture.Demo, "product", "title", n, 1000))
}

// snapshot is a database's replication state, for comparing runs.
func (h *harness) snapshot(id string) string {
	h.t.Helper()
	var out string
	err := h.spaces[id].pool.QueryRow(h.ctx, `SELECT concat_ws(E'\n',
		(SELECT string_agg(concat_ws(' ', event_id, history_table, revision, is_baseline, accepted_at IS NOT NULL, verified_at IS NOT NULL), E'\n' ORDER BY event_id)
		   FROM _ontology_replication_delivery),
		(SELECT string_agg(concat_ws(' ', event_id, verified_at IS NOT NULL), E'\n' ORDER BY event_id) FROM _ontology_replication_receipts),
		(SELECT string_agg(concat_ws(' ', generation, backfill_complete, backfill_cursor, replay_complete, verified_count), E'\n') FROM _ontology_replication_targets))`).Scan(&out)
	require.NoError(h.t, err)
	return out
}

// syncBuffer is a log destination shared by concurrent requests.
type syncBuffer = logbuf.Buffer
