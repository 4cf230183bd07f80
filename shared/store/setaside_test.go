package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestUnpublishableEventsAreSetAside: the SDK's read fails on a missing
// history row, a forged table or a malformed capture, naming it; a claim
// sets such an event aside and goes on with the events behind it, and reads
// nothing from a table without a capture trigger. The same whether the
// claim reads the events in its own statement (a table met before) or in a
// second one (a table met for the first time).
func TestUnpublishableEventsAreSetAside(t *testing.T) {
	for _, warm := range []bool{false, true} {
		t.Run(fmt.Sprintf("table met before=%v", warm), func(t *testing.T) { testUnpublishableEventsAreSetAside(t, warm) })
	}
}

func testUnpublishableEventsAreSetAside(t *testing.T, warm bool) {
	t.Parallel()
	first := `(SELECT min(id::text)::uuid FROM product_history h WHERE EXISTS (SELECT FROM _ontology_replication_delivery d
		WHERE d.event_id = h.id AND d.accepted_at IS NULL))`
	for _, c := range []struct {
		name, change  string
		sdkErr, cause error
		reason        store.Reason
	}{
		{"history row deleted", `DELETE FROM product_history WHERE id = ` + first, store.ErrMissingHistory, store.ErrMissingHistory, store.ReasonMissingHistory},
		// The SDK calls both "missing from retained history"; the store
		// names what happened.
		{"replication cleared", `UPDATE product_history SET replication = NULL WHERE id = ` + first, store.ErrMissingHistory, store.ErrNotCaptured, store.ReasonNotCaptured},
		{"forged table", `UPDATE _ontology_replication_delivery SET history_table = 'customer' WHERE event_id = ` + first, store.ErrNoCaptureTable, store.ErrNoCaptureTable, store.ReasonUnknownTable},
		{"not an event", `UPDATE product_history SET replication = '"text"' WHERE id = ` + first, event.ErrMalformed, event.ErrMalformed, store.ReasonMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, &sdkfixture.V4Template)
			tg := e.start(t)
			if warm {
				e.products(t, 1)
				e.drainAll(t, tg)
				require.Equal(t, []string{"product_history"}, store.ReadTables(e.store), "met: read in the claim's statement")
			}
			e.products(t, 3)
			var bad string
			require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT `+first+`::text`).Scan(&bad))
			e.exec(t, c.change)
			_, err := e.store.PendingEvents(e.ctx, tg)
			require.ErrorIs(t, err, c.sdkErr, "the SDK's read fails on it")

			claim := e.claimOf(t, e.store, tg)
			require.Len(t, claim.Events, 2, "the events behind it are claimed")
			require.NotContains(t, claim.IDs(), bad)
			require.Len(t, claim.Unpublishable, 1)
			aside := claim.Unpublishable[0]
			require.Equal(t, bad, aside.HistoryID)
			require.Equal(t, c.reason, aside.Reason)
			require.Equal(t, sha(tg.SourceID+":"+bad+":"+tg.Generation), aside.EventID)
			require.ErrorIs(t, aside.Cause, c.cause)
			n, err := claim.Acknowledge(e.ctx)
			require.NoError(t, err)
			require.EqualValues(t, 2, n)

			again := e.claimOf(t, e.store, tg)
			require.Empty(t, again.Events, "set aside: no claim takes it until its backoff has passed")
			require.Empty(t, again.Unpublishable)
			again.Release(e.ctx)
			require.EqualValues(t, 1, e.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL
				AND next_verify_at = last_checked_at + interval '1 minute'`), "set aside for the first backoff")
			require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_receipts WHERE event_id = $1::uuid", bad))

			// Another Store (another process) lists it with its reason.
			other, err := store.New(e.pool, store.Config{})
			require.NoError(t, err)
			rep, err := other.ReadSetAside(e.ctx, tg, 10, 10_000_000)
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
	rep, err := e.store.ReadSetAside(e.ctx, tg, 10, 700)
	require.NoError(t, err)
	reasons := map[string]store.Reason{}
	for _, ev := range rep.Events {
		reasons[ev.HistoryID] = ev.Reason
	}
	require.Equal(t, map[string]store.Reason{refused.HistoryID: store.ReasonRejected, large.HistoryID: store.ReasonTooLarge}, reasons)
	limited, err := e.store.ReadSetAside(e.ctx, tg, 1, 700)
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
	rep, err = e.store.ReadSetAside(e.ctx, tg, 10, 700)
	require.NoError(t, err)
	require.Zero(t, rep.Count)
}

// TestEventMissingACapturedKeyIsPublished: a captured event without one of
// the keys the table requires (entity_id, here) is published as the SDK
// publishes it — the message the SDK's read builds, byte for byte — and not
// set aside: the BigQuery subscription's schema judges it (SPEC §4).
func TestEventMissingACapturedKeyIsPublished(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 3)
	first := `(SELECT min(id::text)::uuid FROM product_history h WHERE EXISTS (SELECT FROM _ontology_replication_delivery d
		WHERE d.event_id = h.id AND d.accepted_at IS NULL))`
	var bad string
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT `+first+`::text`).Scan(&bad))
	e.exec(t, `UPDATE product_history SET replication = replication - 'entity_id' WHERE id = `+first)
	sdk, err := e.store.PendingEvents(e.ctx, tg)
	require.NoError(t, err, "the SDK's read builds it")
	claim, err := e.store.Claim(e.ctx, tg)
	require.NoError(t, err)
	require.Empty(t, claim.Unpublishable, "not set aside")
	require.Len(t, claim.Events, 3)
	var want, got []byte
	for _, p := range sdk.Events {
		if p.HistoryID == bad {
			want = p.JSON
		}
	}
	for _, p := range claim.Events {
		if p.HistoryID == bad {
			got = p.JSON
		}
	}
	require.NotNil(t, want)
	require.Equal(t, string(want), string(got), "the SDK's message, byte for byte")
	require.NotContains(t, string(got), `"entity_id"`)
	_, err = claim.Acknowledge(e.ctx)
	require.NoError(t, err)
}
