package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

func TestStateAndTargets(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	paused, err := e.store.State(e.ctx)
	require.NoError(t, err)
	require.Equal(t, store.State{Version: 4, SourceID: paused.SourceID}, paused, "paused, no generation")
	_, _, err = e.store.ActiveTarget(e.ctx)
	require.ErrorIs(t, err, store.ErrNoActiveTarget)

	tg := e.start(t)
	require.Equal(t, e.gen.Generation, tg.Generation)
	require.Equal(t, e.gen.SourceID, tg.SourceID)
	require.Equal(t, 4, tg.Protocol)
	require.True(t, tg.UsesDelivery())
	require.Len(t, tg.Selection, 3)
	require.Equal(t, []string{"products"}, tg.Selection[2].Relationships)
	again, err := e.store.Target(e.ctx, tg.Generation)
	require.NoError(t, err)
	require.Equal(t, tg, again)

	for _, bad := range []string{"00000000-0000-4000-8000-000000000000", "not-a-uuid"} {
		_, err = e.store.Target(e.ctx, bad)
		require.ErrorIs(t, err, store.ErrUnknownGeneration, bad)
	}
}

// TestSchemaErrors: a database without the replication schema, with an
// empty singleton table, or at an unknown protocol version is refused with
// the error naming it, by the state read and by a drain's claim alike.
func TestSchemaErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	both := func(want error, msg string) {
		t.Helper()
		_, err := e.store.State(e.ctx)
		require.ErrorIs(t, err, want, msg)
		require.False(t, store.Retryable(err))
		_, _, c, err := e.store.ClaimActive(e.ctx)
		require.ErrorIs(t, err, want, "claim: %s", msg)
		require.Nil(t, c)
	}
	both(store.ErrNoSchema, "no schema")
	e.exec(t, `CREATE TABLE _ontology_replication (id boolean PRIMARY KEY DEFAULT true, version integer NOT NULL,
		source_id uuid NOT NULL DEFAULT gen_random_uuid(), enabled boolean NOT NULL DEFAULT false, active_generation uuid)`)
	both(store.ErrNoSchema, "no singleton row")
	e.exec(t, `INSERT INTO _ontology_replication (version) VALUES (5)`)
	both(store.ErrUnsupportedProtocol, "version 5")
	_, err := e.store.State(e.ctx)
	require.ErrorContains(t, err, "version 5")
}

// TestPendingEventsMatchTheSDK checks every wire event field against values
// computed independently from the history rows.
func TestPendingEventsMatchTheSDK(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	_, err := e.w.Create(e.ctx, "product", map[string]any{"title": "in the baseline"})
	require.NoError(t, err)
	tg := e.start(t)
	cust, err := e.w.Create(e.ctx, "customer", map[string]any{"name": `Ada "<&>"`, "age": 36, "score": 1.5, "attributes": map[string]any{"k": "v"}})
	require.NoError(t, err)
	order, err := e.w.Create(e.ctx, "order", map[string]any{"reference": "o-1", "customer_id": cust})
	require.NoError(t, err)
	prods := e.products(t, 1)
	require.NoError(t, e.w.Link(e.ctx, "order", "products", order, prods[0]))
	require.NoError(t, e.w.Delete(e.ctx, "customer", cust))
	// A stale generation in the captured event is overridden by the target's.
	e.exec(t, `UPDATE order_history SET replication = jsonb_set(replication, '{generation}', '"00000000-0000-4000-8000-000000000000"')`)

	b, err := e.store.PendingEvents(e.ctx, tg)
	require.NoError(t, err)
	require.Len(t, b.Events, 6, "baseline + 5 captured")
	require.False(t, b.More)

	rows, err := e.pool.Query(e.ctx, `SELECT id, event FROM (SELECT id::text, event FROM _ontology_replication_baselines
		UNION ALL SELECT id::text, replication FROM customer_history
		UNION ALL SELECT id::text, replication FROM order_history
		UNION ALL SELECT id::text, replication FROM product_history) e
		WHERE event IS NOT NULL ORDER BY (event->>'revision')::bigint, id::uuid`)
	require.NoError(t, err)
	type row struct {
		ID    string
		Event map[string]any
	}
	var want []row
	for rows.Next() {
		var r row
		require.NoError(t, rows.Scan(&r.ID, &r.Event))
		want = append(want, r)
	}
	require.NoError(t, rows.Err())
	require.Len(t, want, 6)
	size := event.BatchOverhead
	for i, p := range b.Events {
		w := want[i]
		require.Equal(t, w.ID, p.HistoryID, "revision order")
		require.Equal(t, sha(tg.SourceID+":"+w.ID+":"+tg.Generation), p.EventID)
		var got map[string]any
		require.NoError(t, json.Unmarshal(p.JSON, &got))
		for _, k := range []string{"source_id", "entity_id", "record_key", "record_kind", "revision", "deleted", "schema_hash", "payload"} {
			require.Equal(t, w.Event[k], got[k], k)
		}
		require.Equal(t, tg.Generation, got["generation"])
		require.Len(t, got, 10, "exactly the wire fields")
		size += event.MessageBytes(len(p.JSON))
	}
	require.Equal(t, size, b.Bytes)
	var link, deleted event.Event
	require.NoError(t, json.Unmarshal(b.Events[4].JSON, &link))
	require.NoError(t, json.Unmarshal(b.Events[5].JSON, &deleted))
	require.Equal(t, "edge:products", link.RecordKind)
	require.True(t, deleted.Deleted)
	require.Equal(t, "{}", deleted.Payload)
	require.Empty(t, b.Events[0].HistoryTable, "baseline")
	require.Equal(t, "customer_history", b.Events[1].HistoryTable)
}

func TestAcknowledge(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 150)
	b, err := e.store.PendingEvents(e.ctx, tg)
	require.NoError(t, err)
	require.Len(t, b.Events, event.MaxBatchEvents)
	require.True(t, b.More)

	n, err := e.store.Acknowledge(e.ctx, tg, b.IDs())
	require.NoError(t, err)
	require.EqualValues(t, 100, n)
	require.EqualValues(t, 100, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL AND next_verify_at = accepted_at"))
	require.EqualValues(t, 100, e.count(t, "SELECT count(*) FROM _ontology_replication_receipts r JOIN _ontology_replication_delivery d USING (generation, event_id) WHERE r.accepted_at = d.accepted_at"))
	n, err = e.store.Acknowledge(e.ctx, tg, b.IDs())
	require.NoError(t, err)
	require.Zero(t, n, "acknowledging twice changes nothing")

	next, err := e.store.PendingEvents(e.ctx, tg)
	require.NoError(t, err)
	require.Len(t, next.Events, 50)
	require.False(t, next.More)
	require.NotContains(t, b.IDs(), next.Events[0].HistoryID)

	// The pending events queued a minute apart, from a known time on (and
	// the accepted ones earlier still, which the oldest pending ignores).
	e.exec(t, `UPDATE _ontology_replication_delivery d SET next_verify_at = timestamptz '2026-11-01 00:00:00+00' + n.i * interval '1 minute'
		FROM (SELECT event_id, row_number() OVER (ORDER BY event_id DESC) AS i FROM _ontology_replication_delivery WHERE accepted_at IS NULL) n
		WHERE d.event_id = n.event_id`)
	e.exec(t, `UPDATE _ontology_replication_delivery SET next_verify_at = timestamptz '2026-10-01 00:00:00+00' WHERE accepted_at IS NOT NULL`)
	status, err := e.store.Status(e.ctx, tg)
	require.NoError(t, err)
	oldest := time.Date(2026, 11, 1, 0, 1, 0, 0, time.UTC)
	require.True(t, status.OldestPending.Equal(oldest), "the oldest pending event was queued at %v, not %v", oldest, status.OldestPending)
	status.OldestPending = time.Time{}
	// Nothing was in the baseline, so the generation is initially ready at once.
	require.Equal(t, store.Status{Total: 150, Accepted: 100, Verified: 0, Pending: 50,
		DueVerifications: 100, InitiallyReady: true}, status)
}

// TestIDLists: the id lists take uuids in PostgreSQL's text form, in upper
// case or without hyphens, and refuse anything else with an error naming
// the id, changing nothing.
func TestIDLists(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 3)
	b, err := e.store.PendingEvents(e.ctx, tg)
	require.NoError(t, err)
	ids := b.IDs()
	for name, op := range map[string]func([]string) (int64, error){
		"acknowledge": func(ids []string) (int64, error) { return e.store.Acknowledge(e.ctx, tg, ids) },
		"verify":      func(ids []string) (int64, error) { return e.store.Verify(e.ctx, tg, ids) },
		"retry": func(ids []string) (int64, error) {
			requeued, err := e.store.Retry(e.ctx, tg, ids)
			return int64(len(requeued)), err
		},
	} {
		_, err := op([]string{ids[0], "not-a-uuid"})
		require.ErrorContains(t, err, `"not-a-uuid" is not a uuid`, name)
	}
	require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL"))
	require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_receipts"))

	n, err := e.store.Acknowledge(e.ctx, tg, []string{strings.ToUpper(ids[0]), strings.ReplaceAll(ids[1], "-", ""), ids[2]})
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
}

func TestClaimAndRelease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 150)
	first, err := e.store.Claim(e.ctx, tg)
	require.NoError(t, err)
	require.Len(t, first.Events, 100)
	second, err := e.store.Claim(e.ctx, tg)
	require.NoError(t, err)
	require.Len(t, second.Events, 50, "a concurrent claim skips the locked rows")
	for _, id := range second.IDs() {
		require.NotContains(t, first.IDs(), id)
	}
	// The SDK's unlocked read sees the same first 100 whatever is claimed.
	unlocked, err := e.store.PendingEvents(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, first.IDs(), unlocked.IDs())

	second.Release(e.ctx)
	second.Release(e.ctx) // idempotent
	_, err = first.Acknowledge(e.ctx)
	require.NoError(t, err)
	rest := e.drainAll(t, tg)
	require.ElementsMatch(t, second.IDs(), rest, "released events are claimed again")
	require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}

// setMessageBytes rewrites a history row's payload so that its event counts
// exactly want bytes in a batch.
func setMessageBytes(t *testing.T, e *env, tg store.Target, historyID string, want int) {
	t.Helper()
	var raw []byte
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT replication FROM product_history WHERE id = $1::uuid`, historyID).Scan(&raw))
	js, _, err := event.AppendMessage(nil, raw, tg.SourceID, historyID, tg.Generation)
	require.NoError(t, err)
	var cur event.Event
	require.NoError(t, json.Unmarshal(js, &cur))
	base := len(js) - (len(event.AppendString(nil, cur.Payload)) - 2)
	jsonLen := (want - 12) / 4 * 3
	require.Equal(t, want, event.MessageBytes(jsonLen))
	payload := strings.Repeat("x", jsonLen-base)
	e.exec(t, `UPDATE product_history SET replication = jsonb_set(replication, '{payload}', to_jsonb($2::text)) WHERE id = $1::uuid`, historyID, payload)
}

func TestByteBound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 4)
	b, err := e.store.PendingEvents(e.ctx, tg)
	require.NoError(t, err)
	ids := b.IDs()

	// 499,984 + 499,984 + 32 = 1,000,000: both fit exactly at the bound.
	setMessageBytes(t, e, tg, ids[0], 499_984)
	setMessageBytes(t, e, tg, ids[1], 499_984)
	b, err = e.store.PendingEvents(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, ids[:2], b.IDs())
	require.Equal(t, event.MaxBatchBytes, b.Bytes)
	require.True(t, b.More)

	// Four bytes more and the second event leads the next batch.
	setMessageBytes(t, e, tg, ids[1], 499_988)
	b, err = e.store.PendingEvents(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, ids[:1], b.IDs())

	// An event past the bound alone: the SDK's read fails naming it; a claim
	// returns it alone, and the events behind it follow in the next batch.
	setMessageBytes(t, e, tg, ids[0], 1_000_000)
	_, err = e.store.PendingEvents(e.ctx, tg)
	var oversize *event.OversizeError
	require.ErrorAs(t, err, &oversize)
	require.Equal(t, ids[0], oversize.HistoryID)
	require.Equal(t, sha(tg.SourceID+":"+ids[0]+":"+tg.Generation), oversize.EventID)
	require.Contains(t, err.Error(), ids[0])

	c, err := e.store.Claim(e.ctx, tg)
	require.NoError(t, err)
	require.True(t, c.Oversize)
	require.Equal(t, ids[:1], c.IDs())
	require.True(t, c.More)
	_, err = c.Acknowledge(e.ctx)
	require.NoError(t, err)
	c, err = e.store.Claim(e.ctx, tg)
	require.NoError(t, err)
	require.False(t, c.Oversize)
	require.Equal(t, ids[1:], c.IDs(), "the oversize event does not block those behind it")
	c.Release(e.ctx)

	// An oversize event behind others ends the batch before it.
	e.exec(t, `UPDATE _ontology_replication_delivery SET accepted_at = NULL`)
	setMessageBytes(t, e, tg, ids[0], 1000)
	setMessageBytes(t, e, tg, ids[2], 1_000_004)
	c, err = e.store.Claim(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, ids[:2], c.IDs())
	require.False(t, c.Oversize)
	c.Release(e.ctx)
}

// TestUnpublishableEventsAreSetAside: the SDK's read fails on a missing
// history row, a forged table or a malformed capture, naming it; a claim
// sets such an event aside and goes on with the events behind it, and reads
// nothing from a table without a capture trigger.
func TestUnpublishableEventsAreSetAside(t *testing.T) {
	t.Parallel()
	first := `(SELECT min(id::text)::uuid FROM product_history)`
	for _, c := range []struct {
		name, change string
		sdkErr       error
		reason       store.Reason
	}{
		{"history row deleted", `DELETE FROM product_history WHERE id = ` + first, store.ErrMissingHistory, store.ReasonMissingHistory},
		{"replication cleared", `UPDATE product_history SET replication = NULL WHERE id = ` + first, store.ErrMissingHistory, store.ReasonMissingHistory},
		{"forged table", `UPDATE _ontology_replication_delivery SET history_table = 'customer' WHERE event_id = ` + first, store.ErrNoCaptureTable, store.ReasonUnknownTable},
		{"not an event", `UPDATE product_history SET replication = '"text"' WHERE id = ` + first, event.ErrMalformed, store.ReasonMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, &sdkfixture.V4Template)
			tg := e.start(t)
			e.products(t, 3)
			var bad string
			require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT `+first+`::text`).Scan(&bad))
			e.exec(t, c.change)
			_, err := e.store.PendingEvents(e.ctx, tg)
			require.ErrorIs(t, err, c.sdkErr, "the SDK's read fails on it")

			claim, err := e.store.Claim(e.ctx, tg)
			require.NoError(t, err)
			require.Len(t, claim.Events, 2, "the events behind it are claimed")
			require.NotContains(t, claim.IDs(), bad)
			require.Len(t, claim.Unpublishable, 1)
			aside := claim.Unpublishable[0]
			require.Equal(t, bad, aside.HistoryID)
			require.Equal(t, c.reason, aside.Reason)
			require.Equal(t, sha(tg.SourceID+":"+bad+":"+tg.Generation), aside.EventID)
			require.ErrorIs(t, aside.Cause, c.sdkErr)
			n, err := claim.Acknowledge(e.ctx)
			require.NoError(t, err)
			require.EqualValues(t, 2, n)

			again, err := e.store.Claim(e.ctx, tg)
			require.NoError(t, err)
			require.Empty(t, again.Events, "set aside: no claim takes it until its backoff has passed")
			require.Empty(t, again.Unpublishable)
			again.Release(e.ctx)
			require.EqualValues(t, 1, e.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL
				AND next_verify_at = last_checked_at + interval '1 minute'`), "set aside for the first backoff")
			require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_receipts WHERE event_id = $1::uuid", bad))

			// Another Store (another process) lists it with its reason.
			other, err := store.New(e.pool, store.Config{})
			require.NoError(t, err)
			rep, err := other.SetAside(e.ctx, tg, 10, 10_000_000)
			require.NoError(t, err)
			require.EqualValues(t, 1, rep.Count)
			require.Len(t, rep.Events, 1)
			got := rep.Events[0]
			require.Equal(t, bad, got.HistoryID)
			require.Equal(t, aside.EventID, got.EventID)
			require.Equal(t, c.reason, got.Reason, got.Detail)
			require.Equal(t, 1, got.Attempts)
			require.Equal(t, time.Minute, got.NextAttempt.Sub(got.Since))
		})
	}
}

// TestSetAsideReasonsAndRetry: an event Pub/Sub refused and one too large
// for a request are listed as such; RetrySetAside makes both claimable at
// once, as fresh events.
func TestSetAsideReasonsAndRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 3)
	c, err := e.store.Claim(e.ctx, tg)
	require.NoError(t, err)
	refused, large := c.Events[0], c.Events[1]
	setMessageBytes(t, e, tg, large.HistoryID, 1000)
	_, err = c.Finish(e.ctx, []string{c.Events[2].HistoryID}, []store.SetAside{
		{HistoryID: refused.HistoryID, Reason: store.ReasonRejected},
		{HistoryID: large.HistoryID, Reason: store.ReasonTooLarge},
	})
	require.NoError(t, err)
	rep, err := e.store.SetAside(e.ctx, tg, 10, 700)
	require.NoError(t, err)
	reasons := map[string]store.Reason{}
	for _, ev := range rep.Events {
		reasons[ev.HistoryID] = ev.Reason
	}
	require.Equal(t, map[string]store.Reason{refused.HistoryID: store.ReasonRejected, large.HistoryID: store.ReasonTooLarge}, reasons)
	limited, err := e.store.SetAside(e.ctx, tg, 1, 700)
	require.NoError(t, err)
	require.EqualValues(t, 2, limited.Count)
	require.Len(t, limited.Events, 1, "listed up to the limit, counted in full")

	n, err := e.store.RetrySetAside(e.ctx, tg)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	again, err := e.store.Claim(e.ctx, tg)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{refused.HistoryID, large.HistoryID}, again.IDs())
	for _, p := range again.Events {
		require.Zero(t, p.Backoff, "fresh again")
	}
	again.Release(e.ctx)
	rep, err = e.store.SetAside(e.ctx, tg, 10, 700)
	require.NoError(t, err)
	require.Zero(t, rep.Count)
}

func TestVerifyAndRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.products(t, 1) // in the baseline
	tg := e.start(t)
	e.products(t, 5)
	e.drainAll(t, tg)

	due, err := e.store.DueUnverified(e.ctx, tg)
	require.NoError(t, err)
	require.Len(t, due, 6)
	for _, r := range due {
		require.Equal(t, sha(tg.SourceID+":"+r.HistoryID+":"+tg.Generation), r.EventID)
	}
	ids := func(refs []store.Ref) []string {
		var out []string
		for _, r := range refs {
			out = append(out, r.HistoryID)
		}
		return out
	}
	// The baseline event goes to the absent, recent group, so the generation
	// cannot be initially ready before the end.
	var baseline string
	require.NoError(t, e.pool.QueryRow(e.ctx, "SELECT id::text FROM _ontology_replication_baselines").Scan(&baseline))
	for i, r := range due {
		if r.HistoryID == baseline {
			due[i], due[2] = due[2], due[i]
		}
	}
	present, absentRecent, absentOld := ids(due[:2]), ids(due[2:4]), ids(due[4:])
	// Both sides of the 15-minute boundary: the old ones accepted just over
	// 15 minutes ago, the recent ones just under.
	e.exec(t, `UPDATE _ontology_replication_delivery SET accepted_at = now() - interval '15 minutes 5 seconds' WHERE event_id = ANY($1::uuid[])`, absentOld)
	e.exec(t, `UPDATE _ontology_replication_delivery SET accepted_at = now() - interval '14 minutes 55 seconds' WHERE event_id = ANY($1::uuid[])`, absentRecent)

	n, err := e.store.Verify(e.ctx, tg, present)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	n, err = e.store.Verify(e.ctx, tg, present)
	require.NoError(t, err)
	require.Zero(t, n, "verifying twice counts once")
	require.EqualValues(t, 2, e.count(t, "SELECT verified_count FROM _ontology_replication_targets"))
	require.EqualValues(t, 2, e.count(t, "SELECT count(*) FROM _ontology_replication_receipts WHERE verified_at IS NOT NULL"))

	requeued, err := e.store.Retry(e.ctx, tg, append(append([]string{}, absentRecent...), absentOld...))
	require.NoError(t, err)
	require.ElementsMatch(t, absentOld, requeued, "the ones accepted over 15 minutes ago went back to pending")
	require.EqualValues(t, 2, e.count(t, `SELECT count(*) FROM _ontology_replication_delivery
		WHERE event_id = ANY($1::uuid[]) AND accepted_at IS NOT NULL AND last_checked_at > now() - interval '5 seconds'
		  AND next_verify_at = last_checked_at + interval '30 seconds'`, absentRecent), "looked at again exactly 30 seconds after the check")
	require.EqualValues(t, 2, e.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE event_id = ANY($1::uuid[]) AND accepted_at IS NULL`, absentOld))
	require.Zero(t, e.count(t, `SELECT count(*) FROM _ontology_replication_receipts WHERE event_id = ANY($1::uuid[])`, absentOld))
	require.EqualValues(t, 2, e.count(t, `SELECT count(*) FROM _ontology_replication_receipts WHERE event_id = ANY($1::uuid[])`, absentRecent))

	due, err = e.store.DueUnverified(e.ctx, tg)
	require.NoError(t, err)
	require.Empty(t, due, "retried events are not due for 30 seconds; requeued ones are pending")

	status, err := e.store.Status(e.ctx, tg)
	require.NoError(t, err)
	require.EqualValues(t, 6, status.Total)
	require.EqualValues(t, 4, status.Accepted)
	require.EqualValues(t, 2, status.Verified)
	require.EqualValues(t, 2, status.Pending)
	require.Zero(t, status.DueVerifications)
	require.False(t, status.InitiallyReady, "the baseline event is not verified")

	again := e.drainAll(t, tg)
	require.ElementsMatch(t, absentOld, again, "the sweep republishes what went back to pending")
	e.exec(t, `UPDATE _ontology_replication_delivery SET next_verify_at = now() WHERE verified_at IS NULL`)
	due, err = e.store.DueUnverified(e.ctx, tg)
	require.NoError(t, err)
	require.Len(t, due, 4)
	_, err = e.store.Verify(e.ctx, tg, ids(due))
	require.NoError(t, err)
	ready, err := e.store.InitiallyReady(e.ctx, tg)
	require.NoError(t, err)
	require.True(t, ready)
	status, err = e.store.Status(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, store.Status{Total: 6, Accepted: 6, Verified: 6, InitiallyReady: true}, status)
}

func TestRetryOnlyTouchesCheckedIDs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 3)
	e.drainAll(t, tg)
	e.exec(t, `UPDATE _ontology_replication_delivery SET accepted_at = now() - interval '1 hour'`)
	due, err := e.store.DueUnverified(e.ctx, tg)
	require.NoError(t, err)
	back, err := e.store.Retry(e.ctx, tg, []string{due[0].HistoryID})
	require.NoError(t, err)
	require.Equal(t, []string{due[0].HistoryID}, back)
	require.EqualValues(t, 2, e.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL`),
		"an unchecked backlog is never a delivery failure")
	back, err = e.store.Retry(e.ctx, tg, nil)
	require.NoError(t, err)
	require.Empty(t, back)
}

// TestRetryable: lock and statement timeouts (which every store transaction
// sets) and lost connections are retryable; protocol errors, and PostgreSQL
// errors with a malformed SQLSTATE, are not.
func TestRetryable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 1)
	pending, err := e.store.PendingEvents(e.ctx, tg)
	require.NoError(t, err)
	ids := pending.IDs()
	st, err := store.New(e.pool, store.Config{LockTimeout: 50 * time.Millisecond, StatementTimeout: 100 * time.Millisecond})
	require.NoError(t, err)

	// Hold the lifecycle lock exclusively: the acknowledgement's shared
	// lock waits, and its lock_timeout ends the wait.
	tx, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(e.ctx) }()
	_, err = tx.Exec(e.ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", store.LifecycleLock)
	require.NoError(t, err)
	_, lockErr := st.Acknowledge(e.ctx, tg, ids)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, lockErr, &pgErr)
	require.Equal(t, "55P03", pgErr.Code, "lock_timeout: %v", lockErr)
	require.NoError(t, tx.Rollback(e.ctx))

	// Hold a delivery row: the acknowledgement's update waits for it, and
	// its statement_timeout (shorter than a lock wait would be otherwise)
	// or lock_timeout ends the wait.
	row, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = row.Rollback(e.ctx) }()
	_, err = row.Exec(e.ctx, "SELECT 1 FROM _ontology_replication_delivery FOR UPDATE")
	require.NoError(t, err)
	_, rowErr := st.Acknowledge(e.ctx, tg, ids)
	require.ErrorAs(t, rowErr, &pgErr)
	require.Contains(t, []string{"55P03", "57014"}, pgErr.Code, "%v", rowErr)

	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"lock timeout", lockErr, true},
		{"row lock wait", rowErr, true},
		{"deadline", context.DeadlineExceeded, true},
		{"connection refused", &pgconn.PgError{Code: "08006"}, true},
		{"statement timeout", &pgconn.PgError{Code: "57014"}, true},
		{"deadlock", &pgconn.PgError{Code: "40P01"}, true},
		{"undefined table", &pgconn.PgError{Code: "42P01"}, false},
		{"empty SQLSTATE", &pgconn.PgError{Code: ""}, false},
		{"one-character SQLSTATE", &pgconn.PgError{Code: "5"}, false},
		{"missing history", store.ErrMissingHistory, false},
		{"plain", errors.New("plain"), false},
		{"nil", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, store.Retryable(c.err))
		})
	}
	_, err = store.New(e.pool, store.Config{LockTimeout: -1})
	require.ErrorContains(t, err, "LockTimeout")
}
