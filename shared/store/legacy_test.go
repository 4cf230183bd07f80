package store_test

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestLegacyPaths runs every operation on a protocol-3 database.
func TestLegacyPaths(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V3Template)
	e.products(t, 2) // in the baseline
	tg := e.start(t)
	require.False(t, tg.UsesDelivery())
	require.Equal(t, 3, tg.DeliveryVersion)
	e.products(t, 120)
	order, err := e.w.Create(e.ctx, "order", map[string]any{"reference": "legacy"})
	require.NoError(t, err)
	require.NoError(t, e.w.Delete(e.ctx, "order", order))

	status, err := e.store.Status(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, store.Status{Total: 124, Pending: 124}, status)

	b, err := e.store.PendingEvents(e.ctx, tg)
	require.NoError(t, err)
	require.Len(t, b.Events, 100)
	require.True(t, b.More)
	events := make([]event.Event, len(b.Events))
	for i, p := range b.Events {
		require.NoError(t, json.Unmarshal(p.JSON, &events[i]))
		require.Equal(t, sha(tg.SourceID+":"+p.HistoryID+":"+tg.Generation), p.EventID)
		require.Equal(t, p.EventID, events[i].EventID)
		require.Equal(t, tg.Generation, events[i].Generation)
	}
	require.Equal(t, "0", events[0].Revision, "baseline events first: revision order")
	for i := 1; i < len(events); i++ {
		prev, _ := strconv.Atoi(events[i-1].Revision)
		cur, _ := strconv.Atoi(events[i].Revision)
		require.LessOrEqual(t, prev, cur)
	}

	// An event set aside is skipped by this Store on the legacy path too
	// (in memory: protocol 3 has no delivery row to keep it in).
	first, err := e.store.Claim(e.ctx, tg)
	require.NoError(t, err)
	aside := first.Events[0]
	_, err = first.Finish(e.ctx, nil, []store.SetAside{{HistoryID: aside.HistoryID, EventID: aside.EventID, Reason: store.ReasonRejected}})
	require.NoError(t, err)
	c, err := e.store.Claim(e.ctx, tg)
	require.NoError(t, err)
	require.Len(t, c.Events, 100)
	require.NotContains(t, c.IDs(), aside.HistoryID, "set aside on the legacy path too")
	n, err := c.Acknowledge(e.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 100, n)
	fresh, err := store.New(e.pool, store.Config{})
	require.NoError(t, err)
	later, err := fresh.Claim(e.ctx, tg)
	require.NoError(t, err)
	require.Contains(t, later.IDs(), aside.HistoryID, "another process does not know it")
	later.Release(e.ctx)
	rest := e.drainAll(t, tg)
	require.Len(t, rest, 23)
	rest = drainWith(t, e, fresh, tg)
	require.Len(t, rest, 1)

	status, err = e.store.Status(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, store.Status{Total: 124, Accepted: 124, DueVerifications: 124}, status)

	due, err := e.store.DueUnverified(e.ctx, tg)
	require.NoError(t, err)
	require.Len(t, due, 124)
	var ids []string
	for _, r := range due {
		ids = append(ids, r.HistoryID)
	}
	n, err = e.store.VerifyEvents(e.ctx, tg, ids[:100])
	require.NoError(t, err)
	require.EqualValues(t, 100, n)

	// Legacy retry deletes the receipt of checked, absent events accepted
	// more than 15 minutes ago, and nothing else.
	e.exec(t, `UPDATE _ontology_replication_receipts SET accepted_at = now() - interval '20 minutes' WHERE event_id = ANY($1::uuid[])`, ids[100:110])
	back, err := e.store.RetryUnverified(e.ctx, tg, ids[100:120])
	require.NoError(t, err)
	require.ElementsMatch(t, ids[100:110], back)
	status, err = e.store.Status(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, store.Status{Total: 124, Accepted: 114, Verified: 100, Pending: 10, DueVerifications: 14}, status)

	// Legacy replay: every receipt of the generation goes.
	require.NoError(t, e.store.InitReplay(e.ctx, tg))
	page, err := e.store.AdvanceReplay(e.ctx, tg)
	require.NoError(t, err)
	require.True(t, page.Complete)
	status, err = e.store.Status(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, store.Status{Total: 124, Pending: 124}, status)

	_, err = e.store.AdvanceBackfill(e.ctx, tg)
	require.ErrorIs(t, err, store.ErrUnsupportedProtocol)
}

// TestLegacyScanFindsRenamedHistoryTables: history tables are found through
// their capture triggers, so a renamed table is still scanned.
func TestLegacyScanFindsRenamedHistoryTables(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V3Template)
	tg := e.start(t)
	e.products(t, 3)
	e.exec(t, `ALTER TABLE product_history RENAME TO "Product History"`)
	fresh, err := store.New(e.pool, store.Config{})
	require.NoError(t, err)
	b, err := fresh.PendingEvents(e.ctx, tg)
	require.NoError(t, err)
	require.Len(t, b.Events, 3)
	e.exec(t, `DROP TRIGGER _ontology_capture ON "Product History"`)
	fresh, err = store.New(e.pool, store.Config{})
	require.NoError(t, err)
	_, err = fresh.PendingEvents(e.ctx, tg)
	require.ErrorIs(t, err, store.ErrNoCaptureTable)
	require.ErrorContains(t, err, sdkfixture.CaptureFunction("ent_product"))
}
