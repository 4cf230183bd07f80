package delivery_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// products commits n products in bulk (one event each).
func (r *rig) products(tb testing.TB, n int) {
	tb.Helper()
	require.NoError(tb, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", n, 1000))
}

// drainAll publishes everything pending.
func (r *rig) drainAll(tb testing.TB) {
	tb.Helper()
	_, err := r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{})
	require.NoError(tb, err)
}

// verify runs a verifier pass over w1, with no sweep unless opts asks.
func (r *rig) verify(tb testing.TB, opts delivery.VerifyAllOptions) delivery.VerifyResult {
	tb.Helper()
	pass := r.svc.VerifyAll(r.ctx, opts)
	require.Len(tb, pass.Workspaces, 1)
	return pass.Workspaces[0]
}

// answer makes BigQuery answer the lookups with f, after checking that a
// lookup is parameterised as it must be (no id pasted into the SQL).
func (r *rig) answer(tb testing.TB, f bqserver.Handler) {
	g := bqserver.Handler(func(ctx context.Context, q bqserver.Query) (bqserver.Result, error) {
		ids := q.Params["ids"]
		if gens := q.Params["generations"]; ids.Type != "ARRAY" || ids.ArrayType != "STRING" || gens.Type != "ARRAY" || gens.ArrayType != "STRING" {
			tb.Errorf("lookup parameters are not ARRAY<STRING> ids and generations: %+v", q.Params)
		}
		for _, id := range ids.Values {
			if strings.Contains(q.SQL, id) {
				tb.Errorf("an id was pasted into the SQL: %s", q.SQL)
			}
		}
		return f(ctx, q)
	})
	r.lookup.Store(&g)
}

// everyID answers a lookup with every id asked: all landed.
func everyID(_ context.Context, q bqserver.Query) (bqserver.Result, error) {
	return bqserver.Strings("event_id", q.Params["ids"].Values), nil
}

func TestVerifyAllPresent(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	r.answer(t, everyID)
	r.products(t, 30)
	r.drainAll(t)
	res := r.verify(t, delivery.VerifyAllOptions{})
	require.Equal(t, delivery.OutcomeVerified, res.Outcome)
	require.Equal(t, 30, res.Checked)
	require.Equal(t, 30, res.Verified)
	require.Zero(t, res.Retried)
	require.Equal(t, 1, res.Rounds, "one lookup for up to 1,000 events")
	require.EqualValues(t, 1, r.bq.Queries())
	require.EqualValues(t, 30, r.count(t, "SELECT verified_count FROM _ontology_replication_targets"))
	require.EqualValues(t, 30, r.count(t, "SELECT count(*) FROM _ontology_replication_receipts WHERE verified_at IS NOT NULL"))
}

func TestVerifyRetriesAbsentEventsAndSweeps(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	r.products(t, 10)
	r.drainAll(t)
	// Lookups answer nothing: every event is absent.
	r.answer(t, func(context.Context, bqserver.Query) (bqserver.Result, error) {
		return bqserver.Result{Columns: []string{"event_id"}}, nil
	})
	// Half were accepted more than 15 minutes ago.
	_, err := r.pool.Exec(r.ctx, `UPDATE _ontology_replication_delivery SET accepted_at = now() - interval '16 minutes'
		WHERE event_id IN (SELECT event_id FROM _ontology_replication_delivery ORDER BY revision LIMIT 5)`)
	require.NoError(t, err)
	before := len(r.srv.Messages())
	res := r.verify(t, delivery.VerifyAllOptions{SweepBatches: delivery.DefaultSweepBatches})
	require.Equal(t, 10, res.Checked)
	require.Zero(t, res.Verified)
	require.Equal(t, 10, res.Retried)
	require.Equal(t, 5, res.Requeued)
	require.Equal(t, 5, res.Swept, "the sweep republished what went back to pending")
	require.Len(t, r.srv.Messages(), before+5)
	require.EqualValues(t, 5, r.count(t, `SELECT count(*) FROM _ontology_replication_delivery
		WHERE accepted_at > now() - interval '1 minute' AND next_verify_at > now() + interval '20 seconds'`), "recent absent events are looked for again in 30 s")
	require.EqualValues(t, 10, r.count(t, "SELECT count(*) FROM _ontology_replication_receipts"), "requeued ones were re-acknowledged")

	// Once they land, the next pass verifies them (checks made due now).
	r.answer(t, everyID)
	_, err = r.pool.Exec(r.ctx, `UPDATE _ontology_replication_delivery SET next_verify_at = now() WHERE verified_at IS NULL`)
	require.NoError(t, err)
	res = r.verify(t, delivery.VerifyAllOptions{})
	require.Equal(t, 10, res.Verified)
	require.EqualValues(t, 10, r.count(t, "SELECT verified_count FROM _ontology_replication_targets"))
}

func TestVerifyIgnoresUnaskedIDs(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	r.products(t, 2)
	r.drainAll(t)
	r.answer(t, func(ctx context.Context, q bqserver.Query) (bqserver.Result, error) {
		res, err := everyID(ctx, q)
		junk := strings.Repeat("0", 64)
		res.Rows = append(res.Rows, []*string{&junk}, []*string{res.Rows[0][0]})
		return res, err
	})
	res := r.verify(t, delivery.VerifyAllOptions{})
	require.Equal(t, 2, res.Verified)
	require.EqualValues(t, 2, r.count(t, "SELECT verified_count FROM _ontology_replication_targets"))
}

// TestVerifyRespectsTheBudget: the pass's budget cuts a round in flight,
// and what the rounds before it verified stays verified. The budget is
// ten times what the first round needs on an idle machine, so the test
// holds on a busy one; the second lookup never answers, so the budget,
// not the lookup's own time-out (20 s), is what ends it.
func TestVerifyRespectsTheBudget(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	r.products(t, 3000)
	r.drainAll(t)
	var lookups atomic.Int64
	r.answer(t, func(ctx context.Context, q bqserver.Query) (bqserver.Result, error) {
		if lookups.Add(1) == 1 {
			return everyID(ctx, q)
		}
		<-ctx.Done()
		return bqserver.Result{}, ctx.Err()
	})
	res := r.verify(t, delivery.VerifyAllOptions{Budget: 10 * time.Second})
	require.Equal(t, 1000, res.Verified, "the first round's lookup answered within the budget: its events are verified")
	require.Equal(t, delivery.OutcomePartial, res.Outcome, "the budget ran out with events due")
	require.Empty(t, res.Error, "running out of time is not a failure")
	require.EqualValues(t, 2, lookups.Load(), "a second round started and was cut at the budget")
	require.EqualValues(t, 1000, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NOT NULL"))
	require.Zero(t, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NULL AND last_checked_at IS NOT NULL"),
		"the cut round changed nothing")
}

func TestVerifyLegacyDatabase(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4, withTemplate(&sdkfixture.V3Template))
	r.products(t, 5)
	r.drainAll(t)
	require.EqualValues(t, 5, r.count(t, "SELECT count(*) FROM _ontology_replication_receipts"))
	r.answer(t, func(ctx context.Context, q bqserver.Query) (bqserver.Result, error) {
		res, err := everyID(ctx, q)
		res.Rows = res.Rows[:3]
		return res, err
	})
	_, err := r.pool.Exec(r.ctx, `UPDATE _ontology_replication_receipts SET accepted_at = now() - interval '20 minutes'`)
	require.NoError(t, err)
	res := r.verify(t, delivery.VerifyAllOptions{SweepBatches: delivery.DefaultSweepBatches})
	require.Equal(t, 3, res.Verified)
	require.Equal(t, 2, res.Requeued, "legacy retry deletes the receipts of old absent events")
	require.Equal(t, 2, res.Swept)
	require.EqualValues(t, 3, r.count(t, "SELECT count(*) FROM _ontology_replication_receipts WHERE verified_at IS NOT NULL"))
}
