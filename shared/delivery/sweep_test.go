package delivery_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
)

// TestVerifySweepStopsAtItsBatchLimit: the sweep publishes at most
// SweepBatches batches of pending events per workspace per pass; the rest
// wait for the next pass (or a wake-up).
func TestVerifySweepStopsAtItsBatchLimit(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	r.products(t, 450)
	opts := delivery.VerifyAllOptions{SweepBatches: 2}
	require.Equal(t, 200, r.verify(t, opts).Swept, "two batches of 100")
	require.Len(t, r.srv.Messages(), 200)
	require.EqualValues(t, 250, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
	require.Equal(t, 200, r.verify(t, opts).Swept)
	require.Equal(t, 50, r.verify(t, opts).Swept)
	require.Zero(t, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}
