package delivery_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestLegacyDrainPublishesEachEventOnce: on a protocol 3 database a drain
// asked for four drains publishes every captured event exactly once (the
// legacy scan locks nothing: side by side, drains would publish the same
// batches) and leaves a receipt of each; the next drain finds nothing.
func TestLegacyDrainPublishesEachEventOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, 8, withTemplate(&sdkfixture.V3Template))
	r.products(t, 750)
	res, err := r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{Drains: 4})
	require.NoError(t, err)
	require.Equal(t, 750, res.Published)
	require.Equal(t, delivery.StateActive, res.State)
	times := r.publishedTimes(t)
	require.Len(t, times, 750)
	for id, n := range times {
		require.Equal(t, 1, n, "event %s published more than once", id)
	}
	require.EqualValues(t, 750, r.count(t, "SELECT count(*) FROM _ontology_replication_receipts"))
	res, err = r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{Drains: 4})
	require.NoError(t, err)
	require.Zero(t, res.Published)
}

// TestLegacyDrainStopsWhenReplicationIsPaused: a paused legacy database
// publishes nothing, and the drain says so.
func TestLegacyDrainStopsWhenReplicationIsPaused(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4, withTemplate(&sdkfixture.V3Template))
	r.products(t, 10)
	require.NoError(t, sdkfixture.Pause(r.ctx, r.pool))
	res, err := r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{Drains: 2})
	require.NoError(t, err)
	require.True(t, res.Paused)
	require.Zero(t, res.Published)
	require.Empty(t, r.srv.Messages())
}
