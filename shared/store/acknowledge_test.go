package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

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
