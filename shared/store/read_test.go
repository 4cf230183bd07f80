package store_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

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
