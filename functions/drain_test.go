package functions

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/logging"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/testbench/tokenissuer"
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

// TestDrainPublishesTheOldestEventsInBatches: a wake-up publishes the
// pending events oldest first, one byte-bounded batch per Publish request,
// each acknowledged after Pub/Sub took it, and goes on while more are
// pending; its answer says what it did.
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

	// One wake-up goes on while more are pending, for up to the drain's
	// 2 s: on a busy machine the next wake-up takes what is left.
	published, batches, bytes := 0.0, 0.0, 0.0
	for {
		code, body := h.wake("w1")
		require.Equal(t, http.StatusOK, code, body)
		require.Equal(t, map[string]any{"workspace": "w1", "generation": ws.gen.Generation, "state": "active",
			"published": body["published"], "batches": body["batches"], "more": body["more"], "bytes": body["bytes"]}, body)
		published += body["published"].(float64)
		batches += body["batches"].(float64)
		bytes += body["bytes"].(float64)
		if body["more"] == false {
			break
		}
	}
	require.Equal(t, 250.0, published)
	require.Equal(t, 3.0, batches)
	require.Equal(t, []int{100, 100, 50}, requests.get(), "one batch of at most 100 events per Publish request")
	msgs := h.pubsub.Messages()
	require.Len(t, msgs, 250)
	for i, m := range msgs {
		var got map[string]any
		require.NoError(t, json.Unmarshal(m.Data, &got))
		w := expected[i]
		require.Equal(t, sha(ws.gen.SourceID+":"+w.id+":"+ws.gen.Generation), got["event_id"])
		require.Equal(t, ws.gen.Generation, got["generation"])
		for _, k := range []string{"source_id", "entity_id", "record_key", "record_kind", "revision", "deleted", "schema_hash", "payload"} {
			require.Equal(t, w.raw[k], got[k], k)
		}
	}
	require.Equal(t, cust, h.published("w1")[0].RecordKey, "oldest first")
	require.EqualValues(t, 250, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL"))
	require.EqualValues(t, 250, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"))
	size := 0
	for i, m := range msgs {
		if i%100 == 0 {
			size += event.BatchOverhead
		}
		size += event.MessageBytes(len(m.Data))
	}
	require.EqualValues(t, size, bytes)

	code, body := h.wake("w1")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 0.0, body["published"])
	require.Len(t, h.pubsub.Messages(), 250)

	logs := h.logs.String()
	for _, field := range []string{`"workspace":"w1"`, `"count":250`, `"batches":3`, `"bytes":`, `"duration_ms":`, `"outcome":"ok"`} {
		require.Contains(t, logs, field)
	}
}

func TestDrainRefusesBadCallers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withWorkspaces("w1", "w2"))
	h.products("w1", 3)
	h.products("w2", 3)
	other, err := newIssuerLike(h)
	require.NoError(t, err)
	now := time.Now()
	sign := func(c jwt.Claims) string {
		tok, err := h.issuer.Sign(c)
		require.NoError(t, err)
		return tok
	}
	base := jwt.Claims{Issuer: h.issuer.URL, Subject: "runtime-w1", Audience: jwt.Audience{"replication"},
		Expiry: jwt.NewNumericDate(now.Add(time.Minute))}
	with := func(f func(*jwt.Claims)) string { c := base; f(&c); return sign(c) }
	good := sign(base)
	parts := strings.Split(good, ".")
	path := "/api/internal/v1/workspaces/w1/ontology/replication/drain"
	cases := []struct {
		name, path, token, org string
		status                 int
	}{
		{"missing token", path, "", "org-w1", 401},
		{"malformed", path, "x.y.z", "org-w1", 401},
		{"expired", path, with(func(c *jwt.Claims) { c.Expiry = jwt.NewNumericDate(now.Add(-time.Hour)) }), "org-w1", 401},
		{"wrong issuer", path, with(func(c *jwt.Claims) { c.Issuer = "https://evil.test" }), "org-w1", 401},
		{"wrong audience", path, with(func(c *jwt.Claims) { c.Audience = jwt.Audience{"other"} }), "org-w1", 401},
		{"subject of another workspace", path, with(func(c *jwt.Claims) { c.Subject = "runtime-w2" }), "org-w1", 401},
		{"alg none", path, b64(`{"alg":"none","kid":"key-1"}`) + "." + parts[1] + ".", "org-w1", 401},
		{"unknown key id", path, other, "org-w1", 401},
		{"wrong organisation", path, good, "org-w2", 401},
		{"no organisation", path, good, "", 401},
		{"w1's token on w2", "/api/internal/v1/workspaces/w2/ontology/replication/drain", good, "org-w2", 401},
		{"unknown workspace", "/api/internal/v1/workspaces/w9/ontology/replication/drain", good, "org-w1", 401},
		{"other path", "/api/internal/v1/workspaces/w1/other", good, "org-w1", 404},
	}
	answers := map[string]map[string]any{}
	for _, c := range cases {
		code, body := h.call(http.MethodPost, c.path, c.token, c.org)
		require.Equal(t, c.status, code, c.name)
		require.Len(t, body, 1, "%s: only an error message, no detail", c.name)
		require.NotContains(t, body["error"], "runtime-w", c.name)
		answers[c.name] = body
	}
	require.Equal(t, answers["w1's token on w2"], answers["unknown workspace"],
		"an authenticated caller cannot tell a workspace that exists from one that does not")
	// The log tells them apart, and names no workspace the caller was not
	// proven to be: the path's is requested_workspace, quoted.
	for _, l := range parseLines(t, h.logs.String()) {
		if l["message"] != LogDrain || l["outcome"] == "ok" {
			continue
		}
		require.NotContains(t, l, "workspace", "a refused call's line has no workspace field (nor metric label): %v", l)
	}
	require.Contains(t, h.logs.String(), `"requested_workspace":"\"w9\"","outcome":"unknown_workspace"`)
	code, _ := h.call(http.MethodGet, path, good, "org-w1")
	require.Equal(t, http.StatusMethodNotAllowed, code)
	require.Empty(t, h.pubsub.Messages(), "no refused call published anything")
	// No database touched: the product opens a workspace's pool on its
	// first use, and a refused call opened none (not one connection of the
	// product's reached either database).
	for _, id := range []string{"w1", "w2"} {
		require.Zero(t, h.count(id, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'ontology-replication'`), "%s: a refused call connected", id)
	}
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"))

	// Each workspace drains only itself.
	code, body := h.wake("w2")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 3.0, body["published"])
	require.Len(t, h.published("w2"), 3)
	require.Positive(t, h.count("w2", `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'ontology-replication'`), "the probe above sees the product's connections")
	require.Empty(t, h.published("w1"))
	require.EqualValues(t, 3, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// newIssuerLike signs a workspace token with a key the JWKS does not hold.
func newIssuerLike(h *harness) (string, error) {
	other, err := tokenissuer.New(h.issuer.URL, "key-2")
	if err != nil {
		return "", err
	}
	return other.Token("runtime-w1", "replication", time.Minute)
}

func dbName(raw string) string {
	u, _ := url.Parse(raw)
	return strings.TrimPrefix(u.Path, "/")
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestDrainPublishFailureAcknowledgesNothing: a Pub/Sub outage that
// outlasts the drain's requeueing (2 s here; 25 s by default) is a 503 that
// says nothing was acknowledged, and the wake-up after it publishes.
func TestDrainPublishFailureAcknowledgesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withRequeueFor(2*time.Second))
	h.products("w1", 5)
	h.faults.set(status.Error(codes.Unavailable, "injected outage"))
	code, body := h.wake("w1")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body["error"], "nothing was acknowledged")
	require.Contains(t, h.logs.String(), delivery.LogDrainRequeues, "it queued again before it gave up")
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL"))
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"))

	h.faults.set(nil)
	code, body = h.wake("w1")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 5.0, body["published"])
	require.Len(t, h.published("w1"), 5)
}

// TestDrainLostPublishResponseOnlyDuplicates: a Publish whose answer is
// lost after Pub/Sub stored the batch is not acknowledged; the same
// wake-up's drain queues again (a transient fault: it keeps its promise)
// and publishes the batch again. A duplicate, never a loss.
func TestDrainLostPublishResponseOnlyDuplicates(t *testing.T) {
	t.Parallel()
	var lose atomic.Bool
	lose.Store(true)
	h := newHarness(t, withInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if strings.HasSuffix(method, "/Publish") && lose.CompareAndSwap(true, false) {
			return status.Error(codes.DeadlineExceeded, "response lost after the server stored the messages")
		}
		return err
	}))
	h.products("w1", 4)
	code, body := h.wake("w1")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, 4.0, body["published"], "the wake-up's drain went on and published the batch again")
	require.Equal(t, 1.0, body["requeued"], "after queueing once more")
	ids := map[string]int{}
	for _, e := range h.published("w1") {
		ids[e.EventID]++
	}
	require.Len(t, ids, 4)
	for id, n := range ids {
		require.Equal(t, 2, n, "event %s: a duplicate, never a loss", id)
	}
	require.EqualValues(t, 4, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"), "acknowledged once, after the second publish")
}

// TestDrainDatabaseDroppedBetweenPublishAndAcknowledge: the drain's
// sessions cut while Pub/Sub stores its batch: nothing is acknowledged
// that round; the same wake-up's drain queues again on a new connection,
// publishes the batch again and acknowledges it.
func TestDrainDatabaseDroppedBetweenPublishAndAcknowledge(t *testing.T) {
	t.Parallel()
	var drop atomic.Bool
	var h *harness
	h = newHarness(t, withReactor(pstest.ServerReactorOption{FuncName: "Publish", Reactor: reactorFunc(func(req any) (bool, any, error) {
		if drop.CompareAndSwap(true, false) {
			// Cut the drain's database connections while Pub/Sub stores the batch.
			conn, err := pgx.Connect(context.Background(), pgtest.Shared(h.t).AdminURL())
			if err == nil {
				_, err = conn.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
					WHERE application_name = 'ontology-replication' AND datname = $1`, dbName(h.spaces["w1"].url))
				_ = conn.Close(context.Background())
			}
			assert.NoError(h.t, err)
		}
		return false, nil, nil
	})}))
	h.products("w1", 3)
	drop.Store(true)
	code, body := h.wake("w1")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, 3.0, body["published"], "the wake-up's drain went on and published the batch again")
	require.GreaterOrEqual(t, body["requeued"], 1.0)
	require.GreaterOrEqual(t, len(h.published("w1")), 6, "the batch twice: a duplicate, never a loss")
	require.EqualValues(t, 3, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"))
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}

func TestConcurrentWakeUpsTakeDisjointBatches(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.products("w1", 1000)
	var published atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				code, body := h.wake("w1")
				if !assert.Equal(t, http.StatusOK, code, body) {
					return
				}
				published.Add(int64(body["published"].(float64)))
				if body["published"].(float64) == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 1000, published.Load(), "every event acknowledged exactly once")
	ids := map[string]int{}
	for _, e := range h.published("w1") {
		ids[e.EventID]++
	}
	require.Len(t, ids, 1000, "every event published")
	duplicates := len(h.published("w1")) - len(ids)
	require.Zero(t, duplicates, "claims are disjoint: no event published twice")
	require.EqualValues(t, 1000, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"))
}

// publishCounter is a pstest reactor that counts Publish requests and
// refuses (INVALID_ARGUMENT, as Pub/Sub does for a message it can never
// take) every request holding a message that contains one of its marks.
type publishCounter struct {
	requests atomic.Int64
	refusing atomic.Bool
	marks    []string
}

func (p *publishCounter) React(req any) (bool, any, error) {
	p.requests.Add(1)
	if !p.refusing.Load() {
		return false, nil, nil
	}
	for _, m := range req.(*pubsubpb.PublishRequest).Messages {
		for _, mark := range p.marks {
			if strings.Contains(string(m.Data), mark) {
				return true, nil, status.Error(codes.InvalidArgument, "message rejected")
			}
		}
	}
	return false, nil, nil
}

// backoffPasses moves every set-aside event's backoff into the past, as the
// passing of time would.
func (h *harness) backoffPasses(workspace string) {
	_, err := h.spaces[workspace].pool.Exec(h.ctx, `UPDATE _ontology_replication_delivery
		SET next_verify_at = now() - (next_verify_at - last_checked_at), last_checked_at = now() - 2 * (next_verify_at - last_checked_at)
		WHERE accepted_at IS NULL AND last_checked_at IS NOT NULL`)
	require.NoError(h.t, err)
}

// TestPoisonEventDoesNotBlockTheQueue: one event Pub/Sub refuses, in the
// middle of a batch: the other 99 are published and acknowledged, finding
// it costs at most 2 + ⌈log₂ 100⌉ requests, it is logged once, and no
// drain of this or another instance sends it again until its backoff has
// passed; then one request, alone, per backoff; once Pub/Sub takes it, it
// is delivered.
func TestPoisonEventDoesNotBlockTheQueue(t *testing.T) {
	t.Parallel()
	pub := &publishCounter{marks: []string{"POISON"}}
	pub.refusing.Store(true)
	h := newHarness(t, withReactor(pstest.ServerReactorOption{FuncName: "Publish", Reactor: pub}))
	ws := h.spaces["w1"]
	h.products("w1", 50)
	poison, err := ws.w.Create(h.ctx, "product", map[string]any{"title": "POISON"})
	require.NoError(t, err)
	h.products("w1", 49)

	code, body := h.wake("w1")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, 99.0, body["published"])
	require.Equal(t, 1.0, body["set_aside"])
	require.LessOrEqual(t, pub.requests.Load(), int64(2+7), "bisection, not one request per event")
	got := h.published("w1")
	require.Len(t, got, 99)
	for _, e := range got {
		require.NotEqual(t, poison, e.RecordKey)
	}
	require.Equal(t, 1, strings.Count(h.logs.String(), delivery.LogEventsSetAside), "logged once")
	require.Contains(t, h.logs.String(), `"reason":"rejected"`)

	// No drain, of this instance or another, sends it again within its backoff.
	other := h.instance()
	before := pub.requests.Load()
	for range 3 {
		code, body = h.wake("w1")
		require.Equal(t, http.StatusOK, code, body)
		require.Equal(t, 0.0, body["published"])
		code, body = h.wakeOn(other, "w1")
		require.Equal(t, http.StatusOK, code, body)
	}
	require.Equal(t, before, pub.requests.Load(), "no request within the backoff")
	require.Equal(t, 1, strings.Count(h.logs.String(), delivery.LogEventsSetAside))
	require.EqualValues(t, 1, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"), "it stays pending")

	// The backoff passes: one request, alone; refused again, its backoff doubles.
	h.backoffPasses("w1")
	code, body = h.wakeOn(other, "w1")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, 1.0, body["set_aside"])
	require.Equal(t, before+1, pub.requests.Load())
	require.Equal(t, 2, strings.Count(h.logs.String(), delivery.LogEventsSetAside))
	require.EqualValues(t, 1, h.count("w1", `SELECT count(*) FROM _ontology_replication_delivery
		WHERE accepted_at IS NULL AND next_verify_at = last_checked_at + interval '2 minutes'`))

	// Pub/Sub takes it now: after the backoff it is delivered.
	pub.refusing.Store(false)
	h.backoffPasses("w1")
	code, body = h.wake("w1")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, 1.0, body["published"])
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
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
	require.Equal(t, 5.0, body["published"])
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
	require.Equal(t, 4.0, body["published"])
	require.Equal(t, 3.0, body["set_aside"])
	require.NotContains(t, fmt.Sprint(body), "product_history", "no detail leaked")
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
	code, body := h.wake("w1")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "disabled", body["state"])
	require.Equal(t, 0.0, body["published"])
	_, err = h.spaces["w2"].pool.Exec(h.ctx, "UPDATE _ontology_replication SET active_generation = NULL")
	require.NoError(t, err)
	code, body = h.wake("w2")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "no_active_target", body["state"])
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

// TestLogsCarryTheRequestsTrace: every line a request logs carries its
// trace (traceparent, or X-Cloud-Trace-Context), the workspace as its
// label, and a successful invocation's line no error field.
func TestLogsCarryTheRequestsTrace(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.products("w1", 3)
	ws := h.spaces["w1"]
	for _, c := range []struct {
		header, value, trace, span string
	}{
		{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"},
		{"X-Cloud-Trace-Context", "105445aa7843bc8bf206b12000100000/255;o=1", "105445aa7843bc8bf206b12000100000", "00000000000000ff"},
	} {
		t.Run(c.header, func(t *testing.T) {
			h.logs.Reset()
			req := httptest.NewRequest(http.MethodPost, "/api/internal/v1/workspaces/w1/ontology/replication/drain", nil)
			req.Header.Set(headerIdentity, h.token(ws.subject))
			req.Header.Set(headerOrganization, ws.org)
			req.Header.Set(c.header, c.value)
			rec := httptest.NewRecorder()
			h.handler.ServeHTTP(rec, req)
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			var drain map[string]any
			for _, line := range strings.Split(strings.TrimSpace(h.logs.String()), "\n") {
				var entry map[string]any
				require.NoError(t, json.Unmarshal([]byte(line), &entry), line)
				require.Equal(t, "projects/p1/traces/"+c.trace, entry["logging.googleapis.com/trace"], line)
				require.Equal(t, c.span, entry["logging.googleapis.com/spanId"], line)
				if entry["message"] == LogDrain {
					drain = entry
				}
			}
			require.NotNil(t, drain, "the invocation's line")
			require.Equal(t, map[string]any{"workspace": "w1"}, drain["logging.googleapis.com/labels"])
			require.Equal(t, "ok", drain["outcome"])
			require.NotContains(t, drain, "error", "no empty error field on success")
			require.Contains(t, drain, "publish_ms")
		})
	}
}

// unread is a request body that counts the reads of it.
type unread struct{ reads atomic.Int64 }

func (u *unread) Read(p []byte) (int, error) {
	u.reads.Add(1)
	return copy(p, bytes.Repeat([]byte("x"), len(p))), nil
}

// TestDrainReadsNoBody: the wake-up's body, whatever it is (here an
// endless one), is never read: the drain answers from its path and
// headers, and no caller can make it buffer anything.
func TestDrainReadsNoBody(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.products("w1", 3)
	ws := h.spaces["w1"]
	body := &unread{}
	req := httptest.NewRequest(http.MethodPost, "/api/internal/v1/workspaces/w1/ontology/replication/drain", body)
	req.Header.Set(headerIdentity, h.token(ws.subject))
	req.Header.Set(headerOrganization, ws.org)
	rec := httptest.NewRecorder()
	h.handler.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Zero(t, body.reads.Load(), "the body was read")
	require.Len(t, h.published("w1"), 3)
}

// silentPublish never answers a Publish RPC until released.
type silentPublish struct {
	rpcs     atomic.Int64
	released chan struct{}
}

func (s *silentPublish) React(req any) (bool, any, error) {
	if _, ok := req.(*pubsubpb.PublishRequest); !ok {
		return false, nil, nil
	}
	select {
	case <-s.released:
		return false, nil, nil // released: pstest answers
	default:
	}
	s.rpcs.Add(1)
	<-s.released
	return true, nil, status.Error(codes.Unavailable, "released")
}

// TestDrainPublishWithNoAnswer: Pub/Sub takes the request and never
// answers: the drain gives up at its publish timeout, answers 503, and
// acknowledges nothing; one request was sent, and the events are still
// pending for the next wake-up.
func TestDrainPublishWithNoAnswer(t *testing.T) {
	t.Parallel()
	silent := &silentPublish{released: make(chan struct{})}
	h := newHarness(t, withReactor(pstest.ServerReactorOption{FuncName: "Publish", Reactor: silent}))
	h.products("w1", 5)
	code, body := h.wake("w1")
	close(silent.released) // pstest holds its lock while a reactor runs
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body["error"], "nothing was acknowledged")
	require.EqualValues(t, 1, silent.rpcs.Load())
	require.Contains(t, h.logs.String(), "no answer within 5s")
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL"))
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"))
	code, body = h.wake("w1")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, 5.0, body["published"], "the next wake-up publishes them")
}

// parseLines parses JSON log lines.
func parseLines(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		if line == "" {
			continue
		}
		var l map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &l), line)
		out = append(out, l)
	}
	return out
}

// TestDrainTelemetryBoundedAgainstOutsiders: unauthenticated input never
// becomes a metric label or an unbounded line. 200 POSTs to random
// workspace paths, a 200 KB path and a token whose key id is 500 KB leave
// every drain line without a workspace field (the drain_invocations
// metric's label), with outcomes and causes from the code's fixed sets,
// and every line under the logger's bound.
func TestDrainTelemetryBoundedAgainstOutsiders(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for i := range 200 {
		code, _ := h.call(http.MethodPost, fmt.Sprintf("/api/internal/v1/workspaces/random-%d-%s/ontology/replication/drain", i, sha(fmt.Sprint(i))[:8]), "", "")
		require.Equal(t, http.StatusUnauthorized, code)
	}
	code, _ := h.call(http.MethodPost, "/api/internal/v1/workspaces/"+strings.Repeat("w", 200<<10)+"/ontology/replication/drain", "", "")
	require.Equal(t, http.StatusUnauthorized, code)
	bigKid := b64(`{"alg":"ES256","typ":"JWT","kid":"`+strings.Repeat("k", 500<<10)+`"}`) + "." + b64(`{"sub":"runtime-w1"}`) + ".c2ln"
	code, _ = h.call(http.MethodPost, "/api/internal/v1/workspaces/w1/ontology/replication/drain", bigKid, "org-w1")
	require.Equal(t, http.StatusUnauthorized, code)

	outcomes := map[string]bool{}
	lines := 0
	for _, raw := range strings.Split(strings.TrimSpace(h.logs.String()), "\n") {
		require.LessOrEqual(t, len(raw), logging.MaxLineBytes, "a line over the bound")
		var l map[string]any
		require.NoError(t, json.Unmarshal([]byte(raw), &l))
		if l["message"] != LogDrain {
			continue
		}
		lines++
		require.NotContains(t, l, "workspace", "no workspace label from an unauthenticated call")
		require.NotContains(t, l, "logging.googleapis.com/labels", "nor a log label")
		outcomes[l["outcome"].(string)] = true
		for k, v := range l {
			if s, ok := v.(string); ok {
				require.LessOrEqual(t, len(s), logging.MaxValueBytes, k)
			}
		}
	}
	require.Equal(t, 202, lines)
	require.Equal(t, map[string]bool{"unauthorized": true}, outcomes, "one label value, whatever the paths")
}

// TestRefusedRequestsAreSampled: a flood of unauthenticated wake-ups
// writes each at DEBUG and at most one WARNING a second per cause, which
// carries how many refusals it stands for; the count is kept, not lost.
func TestRefusedRequestsAreSampled(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	started := time.Now()
	const calls = 1000
	for range calls {
		code, _ := h.call(http.MethodPost, "/api/internal/v1/workspaces/w1/ontology/replication/drain", "", "")
		require.Equal(t, http.StatusUnauthorized, code)
	}
	elapsed := time.Since(started)
	warnings, debug, counted := 0, 0, 0
	for _, raw := range strings.Split(strings.TrimSpace(h.logs.String()), "\n") {
		var l map[string]any
		require.NoError(t, json.Unmarshal([]byte(raw), &l))
		if l["message"] != LogDrain {
			continue
		}
		require.Equal(t, "unauthorized", l["outcome"])
		switch l["severity"] {
		case "WARNING":
			warnings++
			counted += int(l["refused"].(float64))
		case "DEBUG":
			debug++
			require.NotContains(t, l, "refused")
		default:
			t.Fatalf("a refused request's line at %v", l["severity"])
		}
	}
	require.Equal(t, calls, warnings+debug, "a line for each")
	require.LessOrEqual(t, warnings, 1+int(elapsed/time.Second), "at most one WARNING a second (%v)", elapsed)
	require.Positive(t, warnings)
	require.LessOrEqual(t, counted, calls)
	require.GreaterOrEqual(t, counted, warnings)
}
