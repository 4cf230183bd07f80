package functions

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
)

// drainAll wakes the drain until nothing is pending.
func (h *harness) drainAll(workspace string) {
	h.t.Helper()
	for range 1000 {
		code, body := h.wake(workspace)
		require.Equal(h.t, http.StatusOK, code, body)
		if body["published"].(float64) == 0 {
			return
		}
	}
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

func TestVerifyRetriesAbsentEventsAndSweeps(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.products("w1", 10)
	h.drainAll("w1")
	// Lookups answer nothing: every event is absent.
	h.answer(func(bqserver.Query) (bqserver.Result, error) {
		return bqserver.Result{Columns: []string{"event_id"}}, nil
	})
	// Half were accepted more than 15 minutes ago.
	_, err := h.spaces["w1"].pool.Exec(h.ctx, `UPDATE _ontology_replication_delivery SET accepted_at = now() - interval '16 minutes'
		WHERE event_id IN (SELECT event_id FROM _ontology_replication_delivery ORDER BY revision LIMIT 5)`)
	require.NoError(t, err)
	before := len(h.pubsub.Messages())
	code, resp := h.verify(`{"workspace": "w1"}`)
	require.Equal(t, http.StatusOK, code)
	r := resp.Workspaces[0]
	require.Equal(t, 10, r.Checked)
	require.Zero(t, r.Verified)
	require.Equal(t, 10, r.Retried)
	require.Equal(t, 5, r.Requeued)
	require.Equal(t, 5, r.Swept, "the sweep republished what went back to pending")
	require.Len(t, h.pubsub.Messages(), before+5)
	require.EqualValues(t, 5, h.count("w1", `SELECT count(*) FROM _ontology_replication_delivery
		WHERE accepted_at > now() - interval '1 minute' AND next_verify_at > now() + interval '20 seconds'`), "recent absent events are looked for again in 30 s")
	require.EqualValues(t, 10, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"), "requeued ones were re-acknowledged")

	// Once they land, the next run verifies them (checks made due now).
	h.answer(h.landed)
	_, err = h.spaces["w1"].pool.Exec(h.ctx, `UPDATE _ontology_replication_delivery SET next_verify_at = now() WHERE verified_at IS NULL`)
	require.NoError(t, err)
	code, resp = h.verify("")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 10, resp.Workspaces[0].Verified)
	require.EqualValues(t, 10, h.count("w1", "SELECT verified_count FROM _ontology_replication_targets"))
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

func TestVerifyIgnoresUnaskedIDs(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.products("w1", 2)
	h.drainAll("w1")
	h.answer(func(q bqserver.Query) (bqserver.Result, error) {
		res, err := h.landed(q)
		junk := "0000000000000000000000000000000000000000000000000000000000000000"
		res.Rows = append(res.Rows, []*string{&junk}, []*string{res.Rows[0][0]})
		return res, err
	})
	code, resp := h.verify("")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 2, resp.Workspaces[0].Verified)
	require.EqualValues(t, 2, h.count("w1", "SELECT verified_count FROM _ontology_replication_targets"))
}

func TestVerifyRounds(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withEnv(EnvVerifyBudget, "40s"), withEnv(EnvSweepBatches, "0"))
	h.products("w1", 2500)
	h.drainAll("w1")
	h.answer(h.landed)
	code, resp := h.verify("")
	require.Equal(t, http.StatusOK, code)
	r := resp.Workspaces[0]
	require.Equal(t, 3, r.Rounds, "2,500 due events: rounds of 1,000")
	require.Equal(t, 2500, r.Verified)
	require.EqualValues(t, 3, h.bq.Queries(), "one lookup per round")
}

func TestVerifyRespectsTheBudget(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withEnv(EnvVerifyBudget, "2s"), withEnv(EnvSweepBatches, "0"))
	h.products("w1", 3000)
	h.drainAll("w1")
	// The first lookup answers at once; the second never does (it waits
	// for the verifier to give up on it).
	var lookups atomic.Int64
	h.answerCtx(func(ctx context.Context, q bqserver.Query) (bqserver.Result, error) {
		if lookups.Add(1) == 1 {
			return h.landed(q)
		}
		<-ctx.Done()
		return bqserver.Result{}, ctx.Err()
	})
	code, resp := h.verify("")
	require.Equal(t, http.StatusOK, code, resp)
	r := resp.Workspaces[0]
	require.Equal(t, 1000, r.Verified, "the first round's lookup answered within the budget: its events are verified")
	require.Equal(t, delivery.OutcomePartial, r.Outcome, "the budget ran out with events due")
	require.Empty(t, r.Error, "running out of time is not a failure")
	// Cut by the budget, not by the lookup timeout: a lookup that timed out
	// on its own would have failed the workspace, not left it partial.
	require.EqualValues(t, 2, lookups.Load(), "a second round started and was cut at the budget")
	require.EqualValues(t, 1000, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NOT NULL"))
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NULL AND last_checked_at IS NOT NULL"),
		"the cut round changed nothing")
}

func TestVerifyLegacyDatabase(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withLegacy("w1"))
	h.products("w1", 5)
	h.drainAll("w1")
	require.EqualValues(t, 5, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"))
	h.answer(func(q bqserver.Query) (bqserver.Result, error) {
		res, err := h.landed(q)
		res.Rows = res.Rows[:3]
		return res, err
	})
	_, err := h.spaces["w1"].pool.Exec(h.ctx, `UPDATE _ontology_replication_receipts SET accepted_at = now() - interval '20 minutes'`)
	require.NoError(t, err)
	code, resp := h.verify("")
	require.Equal(t, http.StatusOK, code)
	r := resp.Workspaces[0]
	require.Equal(t, 3, r.Verified)
	require.Equal(t, 2, r.Requeued, "legacy retry deletes the receipts of old absent events")
	require.Equal(t, 2, r.Swept)
	require.EqualValues(t, 3, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts WHERE verified_at IS NOT NULL"))
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

// TestVerifierDiesMidRound: a round looks up, then verifies the present
// events in one transaction and retries the absent in another. Cut after
// the lookup (the verification cannot take its lock) nothing changes; cut
// between the two (the retry cannot take its lock) the present events stay
// verified and the absent untouched. Either way the next pass finishes the
// round: the absent events are retried, nothing is verified twice.
func TestVerifierDiesMidRound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		lock     string // held by a transaction of the test's own during the first pass
		verified int64  // after the first pass
	}{
		{"between lookup and verify", `SELECT 1 FROM _ontology_replication_targets FOR UPDATE`, 0},
		{"between verify and retry", `SELECT 1 FROM _ontology_replication_delivery WHERE event_id = $1::uuid FOR UPDATE`, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.products("w1", 6)
			h.drainAll("w1")
			ws := h.spaces["w1"]
			rows, err := ws.pool.Query(h.ctx, "SELECT event_id::text FROM _ontology_replication_delivery ORDER BY event_id LIMIT 2")
			require.NoError(t, err)
			absent, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			hidden := map[string]bool{}
			for _, id := range absent {
				hidden[event.ID(ws.gen.SourceID, id, ws.gen.Generation)] = true
			}
			var asked atomic.Int64
			h.answer(func(q bqserver.Query) (bqserver.Result, error) {
				asked.Add(int64(len(q.Params["ids"].Values)))
				res, err := h.landed(q)
				var present []string
				for _, row := range res.Rows {
					if !hidden[*row[0]] {
						present = append(present, *row[0])
					}
				}
				return bqserver.Strings("event_id", present), err
			})

			lock, err := ws.pool.Begin(h.ctx)
			require.NoError(t, err)
			args := []any{}
			if strings.Contains(tc.lock, "$1") {
				args = append(args, absent[0])
			}
			_, err = lock.Exec(h.ctx, tc.lock, args...)
			require.NoError(t, err)
			code, pass := h.verify(`{"workspace": "w1"}`)
			require.NoError(t, lock.Rollback(h.ctx))
			require.Equal(t, http.StatusInternalServerError, code)
			require.Equal(t, delivery.OutcomeFailed, pass.Workspaces[0].Outcome)
			require.EqualValues(t, 6, asked.Load(), "one lookup of every due event")
			require.Equal(t, tc.verified, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NOT NULL"))
			require.Equal(t, tc.verified, h.count("w1", "SELECT verified_count FROM _ontology_replication_targets"))
			require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE last_checked_at IS NOT NULL AND verified_at IS NULL"),
				"no absent event was retried")

			asked.Store(0)
			code, pass = h.verify(`{"workspace": "w1"}`)
			require.Equal(t, http.StatusOK, code, pass)
			require.EqualValues(t, 6-tc.verified, asked.Load(), "the next pass looks up only what is still due")
			require.EqualValues(t, 4, h.count("w1", "SELECT verified_count FROM _ontology_replication_targets"), "nothing verified twice")
			require.EqualValues(t, 2, h.count("w1", `SELECT count(*) FROM _ontology_replication_delivery
				WHERE verified_at IS NULL AND last_checked_at IS NOT NULL AND next_verify_at = last_checked_at + interval '30 seconds'`), "the absent ones retried")
		})
	}
}

// TestVerifySweepStopsAtItsBatchLimit: the sweep publishes at most
// VERIFY_SWEEP_BATCHES batches of pending events per workspace per pass;
// the rest wait for the next pass (or a wake-up).
func TestVerifySweepStopsAtItsBatchLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withEnv(EnvSweepBatches, "2"))
	h.products("w1", 450)
	code, pass := h.verify(`{"workspace": "w1"}`)
	require.Equal(t, http.StatusOK, code, pass)
	require.Equal(t, 200, pass.Workspaces[0].Swept, "two batches of 100")
	require.Len(t, h.pubsub.Messages(), 200)
	require.EqualValues(t, 250, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
	_, pass = h.verify(`{"workspace": "w1"}`)
	require.Equal(t, 200, pass.Workspaces[0].Swept)
	_, pass = h.verify(`{"workspace": "w1"}`)
	require.Equal(t, 50, pass.Workspaces[0].Swept)
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}
