package delivery_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
)

// TestReplayPartialSendsBackItsSelectionOnly: a partial replay of the
// products from a revision on publishes those events once more and nothing
// else, reports the accepted-before bound it used, and run again with that
// bound (as a stopped replay is resumed) publishes nothing more: what the
// first run sent back was accepted after the bound.
func TestReplayPartialSendsBackItsSelectionOnly(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	r.products(t, 300)
	for range 5 {
		_, err := r.w.Create(r.ctx, "customer", map[string]any{"name": "c"})
		require.NoError(t, err)
	}
	r.drainAll(t)
	var since int64
	require.NoError(t, r.pool.QueryRow(r.ctx, `SELECT revision FROM _ontology_replication_delivery ORDER BY revision OFFSET 100 LIMIT 1`).Scan(&since))

	sel := delivery.ReplaySelection{Entities: []string{"product"}, SinceRevision: since}
	res, err := r.svc.ReplayPartial(r.ctx, "w1", delivery.PagesOptions{}, sel)
	require.NoError(t, err)
	require.Equal(t, 200, res.Rows, "the products of revision since or later")
	require.NotNil(t, res.Selection)
	require.False(t, res.Selection.AcceptedBefore.IsZero(), "the bound used is reported")
	times := r.publishedTimes(t)
	require.Len(t, times, 305)
	twice := 0
	for _, n := range times {
		if n == 2 {
			twice++
		}
	}
	require.Equal(t, 200, twice, "the selection published once more, nothing else")
	require.Zero(t, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))

	sel.AcceptedBefore = res.Selection.AcceptedBefore
	again, err := r.svc.ReplayPartial(r.ctx, "w1", delivery.PagesOptions{}, sel)
	require.NoError(t, err)
	require.Zero(t, again.Rows, "resumed with the same bound: nothing left to send back")
	require.Len(t, r.srv.Messages(), 305+200)
}

// TestReplayPartialNamesWhatMatchedNothing: record keys of which no event
// was selected are named; a selection that holds no event at all (keys
// that are no record, a revision past every event) is an error, not a
// replay of nothing reported as done.
func TestReplayPartialNamesWhatMatchedNothing(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	id, err := r.w.Create(r.ctx, "product", map[string]any{"title": "p"})
	require.NoError(t, err)
	r.drainAll(t)

	res, err := r.svc.ReplayPartial(r.ctx, "w1", delivery.PagesOptions{}, delivery.ReplaySelection{Records: []string{id, "junk"}})
	require.NoError(t, err)
	require.Equal(t, 1, res.Rows)
	require.Equal(t, []string{"junk"}, res.Unmatched)

	for _, sel := range []delivery.ReplaySelection{{Records: []string{"junk"}}, {Entities: []string{"product"}, SinceRevision: 1_000_000}} {
		res, err = r.svc.ReplayPartial(r.ctx, "w1", delivery.PagesOptions{}, sel)
		require.ErrorIs(t, err, delivery.ErrNothingSelected, "%+v", sel)
		require.Zero(t, res.Rows)
	}
	require.ErrorContains(t, err, "revision 1000000 or later")
}
