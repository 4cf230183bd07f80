package functions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// requestSizes records the number of messages of every Publish request.
type requestSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (r *requestSizes) React(req any) (bool, any, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sizes = append(r.sizes, len(req.(*pubsubpb.PublishRequest).Messages))
	return false, nil, nil
}

func (r *requestSizes) get() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sizes)
}

// TestDrainPublishesTheOldestEventsInBatches: a wake-up is answered at once
// with its promise, and its drainer publishes the pending events oldest
// first, one byte-bounded batch per Publish request, each acknowledged
// after Pub/Sub took it, going on while more are pending; its line says
// what it did.
func TestDrainPublishesTheOldestEventsInBatches(t *testing.T) {
	t.Parallel()
	requests := &requestSizes{}
	h := newHarness(t, withReactor(pstest.ServerReactorOption{FuncName: "Publish", Reactor: requests}))
	ws := h.spaces["w1"]
	cust, err := ws.w.Create(h.ctx, "customer", map[string]any{"name": "Ada", "age": 36})
	require.NoError(t, err)
	h.products("w1", 249)

	// The pending events oldest first, read independently of the store.
	rows, err := ws.pool.Query(h.ctx, `SELECT d.event_id::text, coalesce(c.replication, p.replication)
		FROM _ontology_replication_delivery d
		LEFT JOIN customer_history c ON c.id = d.event_id LEFT JOIN product_history p ON p.id = d.event_id
		WHERE d.accepted_at IS NULL ORDER BY d.revision, d.event_id`)
	require.NoError(t, err)
	type want struct {
		id  string
		raw map[string]any
	}
	expected, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (want, error) {
		var w want
		return w, r.Scan(&w.id, &w.raw)
	})
	require.NoError(t, err)
	require.Len(t, expected, 250)

	// One wake-up: answered at once; its drainer goes on while more are
	// pending.
	code, body := h.wake("w1")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, map[string]any{"workspace": "w1", "promised": true, "coalesced": false, "run": 1.0, "wake": 1.0}, body)
	h.settle()
	run := h.runs("w1")
	require.Equal(t, 250, run.count)
	require.Equal(t, 3, run.batches)
	// The batches are claimed oldest first; several are out at once, so
	// Pub/Sub may store them in another order.
	require.ElementsMatch(t, []int{100, 100, 50}, requests.get(), "one batch of at most 100 events per Publish request")
	msgs := h.pubsub.Messages()
	require.Len(t, msgs, 250)
	byID := map[string]want{}
	for _, w := range expected {
		byID[sha(ws.gen.SourceID+":"+w.id+":"+ws.gen.Generation)] = w
	}
	for _, m := range msgs {
		var got map[string]any
		require.NoError(t, json.Unmarshal(m.Data, &got))
		w, ok := byID[got["event_id"].(string)]
		require.True(t, ok, "an event of the queue: %v", got["event_id"])
		require.Equal(t, ws.gen.Generation, got["generation"])
		for _, k := range []string{"source_id", "entity_id", "record_key", "record_kind", "revision", "deleted", "schema_hash", "payload"} {
			require.Equal(t, w.raw[k], got[k], k)
		}
	}
	require.Equal(t, cust, expected[0].raw["record_key"], "the customer's event is the oldest, claimed in the first batch")
	require.EqualValues(t, 250, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL"))
	require.EqualValues(t, 250, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"))
	size := 3 * event.BatchOverhead
	for _, m := range msgs {
		size += event.MessageBytes(len(m.Data))
	}
	require.EqualValues(t, size, run.bytes)

	code, _ = h.wake("w1")
	require.Equal(t, http.StatusOK, code)
	h.settle()
	require.Len(t, h.pubsub.Messages(), 250, "nothing left to publish")

	logs := h.logs.String()
	for _, field := range []string{`"workspace":"w1"`, `"count":250`, `"batches":3`, `"bytes":`, `"duration_ms":`, `"outcome":"ok"`, `"promised":true`} {
		require.Contains(t, logs, field)
	}
}

// TestDrainPublishesWhatTheSDKWould: a link history row whose changes hold
// no target (the SDK's trigger then captures "record_key": null) is
// published as the SDK would publish it, and the events behind it flow.
func TestDrainPublishesWhatTheSDKWould(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ws := h.spaces["w1"]
	order, err := ws.w.Create(h.ctx, "order", map[string]any{"reference": "o"})
	require.NoError(t, err)
	require.NoError(t, ws.w.Commit(h.ctx, func(c *sdkfixture.Change) error {
		return c.RawHistory("order", order, "link", map[string]any{"products": map[string]any{}})
	}))
	h.products("w1", 3)
	var raw map[string]any
	require.NoError(t, ws.pool.QueryRow(h.ctx, `SELECT replication FROM order_history WHERE kind = 'link'`).Scan(&raw))
	require.Contains(t, raw, "record_key")
	require.Nil(t, raw["record_key"], "the SDK's trigger captured a null record_key")

	code, body := h.wake("w1")
	require.Equal(t, http.StatusOK, code, body)
	h.settle()
	require.Equal(t, 5, h.runs("w1").count)
	var link map[string]any
	for _, m := range h.pubsub.Messages() {
		var ev map[string]any
		require.NoError(t, json.Unmarshal(m.Data, &ev))
		if ev["record_kind"] == "edge:products" {
			link = ev
		}
	}
	require.NotNil(t, link)
	require.Contains(t, link, "record_key")
	require.Nil(t, link["record_key"], "published as captured")
}

// TestDrainSetsAsideWhatItCannotPublish: a missing history row, a delivery
// row naming a table without a capture trigger, and a message Pub/Sub
// refuses as too large (the real service answers INVALID_ARGUMENT over
// 10 MiB; pstest and the emulator take anything, so the reactor refuses
// it): each is set aside, the others are published, and the answer leaks
// no detail.
func TestDrainSetsAsideWhatItCannotPublish(t *testing.T) {
	t.Parallel()
	pub := &publishCounter{marks: []string{"LARGE"}}
	pub.refusing.Store(true)
	h := newHarness(t, withReactor(pstest.ServerReactorOption{FuncName: "Publish", Reactor: pub}))
	ws := h.spaces["w1"]
	h.products("w1", 6)
	_, err := ws.w.Create(h.ctx, "product", map[string]any{"title": "LARGE"})
	require.NoError(t, err)
	for _, q := range []string{
		"DELETE FROM product_history WHERE id = (SELECT event_id FROM _ontology_replication_delivery ORDER BY revision LIMIT 1)",
		"UPDATE _ontology_replication_delivery SET history_table = 'customer' WHERE event_id = (SELECT event_id FROM _ontology_replication_delivery ORDER BY revision OFFSET 1 LIMIT 1)",
	} {
		_, err := ws.pool.Exec(h.ctx, q)
		require.NoError(t, err)
	}
	code, body := h.wake("w1")
	require.Equal(t, http.StatusOK, code, body)
	require.NotContains(t, fmt.Sprint(body), "product_history", "no detail leaked")
	h.settle()
	run := h.runs("w1")
	require.Equal(t, 4, run.count)
	require.Equal(t, 3, run.setAside)
	logs := h.logs.String()
	for _, reason := range []string{"missing_history", "unknown_table", "rejected"} {
		require.Contains(t, logs, `"reason":"`+reason+`"`)
	}
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts r JOIN _ontology_replication_delivery d USING (generation, event_id) WHERE d.accepted_at IS NULL"))
	require.EqualValues(t, 3, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}

type reactorFunc func(any) (bool, any, error)

func (f reactorFunc) React(req any) (bool, any, error) { return f(req) }

func TestDrainStates(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withWorkspaces("w1", "w2"))
	h.products("w1", 2)
	_, err := h.spaces["w1"].pool.Exec(h.ctx, "UPDATE _ontology_replication SET enabled = false")
	require.NoError(t, err)
	code, _ := h.wake("w1")
	require.Equal(t, http.StatusOK, code)
	_, err = h.spaces["w2"].pool.Exec(h.ctx, "UPDATE _ontology_replication SET active_generation = NULL")
	require.NoError(t, err)
	code, _ = h.wake("w2")
	require.Equal(t, http.StatusOK, code)
	h.settle()
	// The drainer behind the answer publishes nothing and logs the state.
	require.Equal(t, runTotals{states: []string{"disabled"}}, h.runs("w1"))
	require.Equal(t, runTotals{states: []string{"no_active_target"}}, h.runs("w2"))
	require.Empty(t, h.pubsub.Messages())
}

func TestMisconfiguredServer(t *testing.T) {
	t.Parallel()
	_, err := newServer(context.Background(), func(string) string { return "" }, dependencies{})
	require.ErrorContains(t, err, "REPLICATION_WORKSPACES")
	_, err = newServer(context.Background(), func(k string) string {
		return map[string]string{"REPLICATION_WORKSPACES": `{"workspaces": [{"id": "w1"}]}`}[k]
	}, dependencies{})
	require.ErrorContains(t, err, "workspaces[0] (w1).database")
	_, err = newServer(context.Background(), func(k string) string {
		return map[string]string{"REPLICATION_WORKSPACES": "{}", EnvVerifyBudget: "forever"}[k]
	}, dependencies{})
	require.ErrorContains(t, err, EnvVerifyBudget)
	s := &server{err: errors.New("bad config"), log: slog.New(slog.DiscardHandler)}
	rec := httptest.NewRecorder()
	s.serveDrain(rec, httptest.NewRequest(http.MethodPost, "/api/internal/v1/workspaces/w1/ontology/replication/drain", nil))
	require.Equal(t, http.StatusInternalServerError, rec.Code)
}
