package functions

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
)

// drainAll wakes the drain and waits for its drainer: nothing is left
// pending.
func (h *harness) drainAll(workspace string) {
	h.t.Helper()
	code, body := h.wake(workspace)
	require.Equal(h.t, http.StatusOK, code, body)
	h.settle()
	require.Zero(h.t, h.count(workspace, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}

// answer makes the in-test BigQuery server answer with f, after checking
// that the lookup is parameterised as it must be.
func (h *harness) answer(f func(q bqserver.Query) (bqserver.Result, error)) {
	h.answerCtx(func(_ context.Context, q bqserver.Query) (bqserver.Result, error) { return f(q) })
}

// answerCtx is answer with the request's context (a slow or stuck
// BigQuery).
func (h *harness) answerCtx(f bqserver.Handler) {
	g := bqserver.Handler(func(ctx context.Context, q bqserver.Query) (bqserver.Result, error) {
		ids := q.Params["ids"]
		if gens := q.Params["generations"]; ids.Type != "ARRAY" || ids.ArrayType != "STRING" || gens.Type != "ARRAY" || gens.ArrayType != "STRING" {
			h.t.Errorf("lookup parameters are not ARRAY<STRING> ids and generations: %+v", q.Params)
		}
		if q.Location != "EU" {
			h.t.Errorf("lookup location %q, want the registry's EU", q.Location)
		}
		for _, id := range ids.Values {
			if len(id) == 64 && strings.Contains(q.SQL, id) {
				h.t.Errorf("an id was pasted into the SQL: %s", q.SQL)
			}
		}
		return f(ctx, q)
	})
	h.bqRows.Store(&g)
}

func TestVerifyAllPresent(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.answer(h.landed)
	h.products("w1", 30)
	h.drainAll("w1")
	code, resp := h.verify("")
	require.Equal(t, http.StatusOK, code)
	require.Len(t, resp.Workspaces, 1)
	r := resp.Workspaces[0]
	require.Equal(t, 30, r.Checked)
	require.Equal(t, 30, r.Verified)
	require.Zero(t, r.Retried)
	require.Equal(t, 1, r.Rounds, "one lookup for up to 1,000 events")
	require.EqualValues(t, 1, h.bq.Queries())
	require.EqualValues(t, 30, h.count("w1", "SELECT verified_count FROM _ontology_replication_targets"))
	require.EqualValues(t, 30, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts WHERE verified_at IS NOT NULL"))
	require.Contains(t, h.logs.String(), "unauthenticated: right for a local or test server only", "the registry's endpoint is warned about")
}

func TestVerifyBigQueryFailureChangesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withWorkspaces("w1", "w2"))
	h.products("w1", 4)
	h.products("w2", 4)
	h.drainAll("w1")
	h.drainAll("w2")
	failing := h.spaces["w1"].gen.Generation
	h.answer(func(q bqserver.Query) (bqserver.Result, error) {
		if slices.Contains(q.Params["generations"].Values, failing) {
			return bqserver.Result{}, &bqserver.Error{Status: 500, Reason: "backendError", Message: "injected"}
		}
		return h.landed(q)
	})
	code, resp := h.verify("")
	require.Equal(t, http.StatusInternalServerError, code)
	byID := map[string]int{}
	for i, r := range resp.Workspaces {
		byID[r.Workspace] = i
	}
	w1, w2 := resp.Workspaces[byID["w1"]], resp.Workspaces[byID["w2"]]
	require.Equal(t, delivery.OutcomeFailed, w1.Outcome)
	require.Empty(t, w1.Error, "the error is in the log, not the answer")
	require.Zero(t, w1.Verified)
	require.Equal(t, delivery.OutcomeVerified, w2.Outcome)
	require.Equal(t, 4, w2.Verified, "the other workspace is still verified")
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NOT NULL OR last_checked_at IS NOT NULL"),
		"a failed lookup retries nothing and verifies nothing")
	require.Regexp(t, `"severity":"ERROR","message":"replication verify workspace","workspace":"w1","outcome":"failed".*"error":"[^"]*injected`, h.logs.String())
}

// FuzzParseVerifyRequest: the verifier's body parser never panics, and
// what it accepts is a request the verifier can run: one workspace or one
// valid shard, never both, and the same once encoded and parsed again.
func FuzzParseVerifyRequest(f *testing.F) {
	for _, seed := range []string{``, `{}`, `{"workspace": "w1"}`, `{"shard": 0, "shards": 4}`, `{"shard": 3, "shards": 3}`,
		`{"workspace": "w1", "shard": 0, "shards": 1}`, `{"shards": 2}`, `{} {}`, `{"budget": "1s"}`, `[`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := parseVerifyRequest(body)
		if err != nil {
			return
		}
		if req.Shard != nil {
			if req.Workspace != "" || *req.Shard < 0 || *req.Shard >= req.Shards || req.Shards > 1000 {
				t.Fatalf("accepted an impossible shard: %+v", req)
			}
		} else if req.Shards != 0 {
			t.Fatalf("accepted shards without a shard: %+v", req)
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		req2, err := parseVerifyRequest(again)
		if err != nil || !reflect.DeepEqual(req, req2) {
			t.Fatalf("%s: accepted, then %s refused or changed: %v %+v", body, again, err, req2)
		}
	})
}
