package delivery_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestVerifierReportsEventsThatKeepNotLanding: an event BigQuery never
// holds is sent back to pending each time it has been accepted for 15
// minutes and republished; past the third time, the verifier's result
// names it (with the times), while the event stays in the cycle.
func TestVerifierReportsEventsThatKeepNotLanding(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2)
	require.NoError(t, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", 3, 3))
	var lost string
	require.NoError(t, r.pool.QueryRow(r.ctx, "SELECT event_id::text FROM _ontology_replication_delivery ORDER BY revision LIMIT 1").Scan(&lost))
	lostEvent := event.ID(r.gen.SourceID, lost, r.gen.Generation)
	r.mu.Lock()
	r.missing = map[string]bool{lostEvent: true}
	r.mu.Unlock()

	var last delivery.VerifyResult
	for cycle := 1; cycle <= 5; cycle++ {
		_, err := r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{})
		require.NoError(t, err)
		// It was accepted more than 15 minutes ago, and its check is due.
		_, err = r.pool.Exec(r.ctx, `UPDATE _ontology_replication_delivery SET accepted_at = now() - interval '16 minutes',
			next_verify_at = now() WHERE event_id = $1::uuid AND verified_at IS NULL`, lost)
		require.NoError(t, err)
		last, err = r.svc.Verify(r.ctx, "w1")
		require.NoError(t, err)
		require.Equal(t, 1, last.Requeued, "cycle %d: sent back to pending", cycle)
		if cycle <= 3 {
			require.Empty(t, last.RequeuedRepeatedly, "cycle %d", cycle)
		}
	}
	require.Equal(t, []delivery.RequeuedEvent{{HistoryID: lost, EventID: lostEvent, Times: 5}}, last.RequeuedRepeatedly)
}

// TestLagBand: each bound belongs to the band above it, a lag just under
// it to the band below.
func TestLagBand(t *testing.T) {
	for _, tc := range []struct {
		lag  time.Duration
		want string
	}{
		{0, "under_1m"},
		{time.Minute - time.Nanosecond, "under_1m"},
		{time.Minute, "under_5m"},
		{5*time.Minute - time.Nanosecond, "under_5m"},
		{5 * time.Minute, "under_15m"},
		{15 * time.Minute, "under_30m"},
		{30*time.Minute - time.Nanosecond, "under_30m"},
		{30 * time.Minute, "under_1h"},
		{time.Hour - time.Nanosecond, "under_1h"},
		{time.Hour, "over_1h"},
		{400 * time.Hour, "over_1h"},
	} {
		t.Run(tc.lag.String(), func(t *testing.T) {
			require.Equal(t, tc.want, delivery.LagBand(tc.lag))
		})
	}
}
