package store_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

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
