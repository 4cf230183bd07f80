package delivery_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// sessionsOpened returns a function that reports how many sessions the
// server opened on the rig's database since it was called
// (pgtest.SessionsOpened).
func (r *rig) sessionsOpened(tb testing.TB) func() int64 {
	tb.Helper()
	return pgtest.SessionsOpened(r.ctx, tb, r.url)
}

// TestDrainAllTakesOneRoundTripABatch: a bulk drain of 30 batches with four
// out at once holds one connection and takes about one round trip a batch:
// each acknowledges the batches whose publishes ended and claims the next.
// (Opening the session, the first claim's read of a table it had not met,
// and the claims that find the end of the queue add a few.)
func TestDrainAllTakesOneRoundTripABatch(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	require.NoError(t, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", 3000, 3000))
	opened := r.sessionsOpened(t)
	before := r.queries.n.Load()
	res, err := r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{Drains: 4})
	require.NoError(t, err)
	require.Equal(t, 3000, res.Published)
	trips := r.queries.n.Load() - before
	t.Logf("%d round trips for 30 batches", trips)
	require.LessOrEqual(t, trips, int64(30+16))
	require.EqualValues(t, 1, opened(), "one connection")
	r.requireEachAcknowledgedOnce(t, r.svc)
}

// TestDrainAllTakesTurnsWithWhile: While's pages and the drain take turns:
// a turn publishes everything pending and returns; between turns the drain
// claims nothing, whatever While writes; when While has returned, the drain
// publishes what is left.
func TestDrainAllTakesTurnsWithWhile(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	pending := func() int64 {
		return r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL")
	}
	write := func(n int) {
		// One commit each, as pages commit one after another: a drain that
		// claimed between turns would take some of them meanwhile.
		for i := range n {
			_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "between turns"})
			require.NoError(t, err)
			require.EqualValues(t, i+1, pending(), "nothing claimed between turns")
		}
	}
	turns := 0
	res, err := r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{Drains: 3, While: func(ctx context.Context, drain func(context.Context) error) error {
		for range 3 {
			write(120)
			require.NoError(t, drain(ctx))
			turns++
			require.Zero(t, pending(), "a turn publishes everything pending")
		}
		write(40)
		return nil
	}})
	require.NoError(t, err)
	require.Equal(t, 3, turns)
	require.Equal(t, 3*120+40, res.Published)
	r.requireEachAcknowledgedOnce(t, r.svc)
}
