package delivery_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
	"github.com/segmentstream/ontology-replication/shared/testbench/logbuf"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// publishedTimes counts how many times each event was published.
func (r *rig) publishedTimes(tb testing.TB) map[string]int {
	tb.Helper()
	out := map[string]int{}
	for _, m := range r.srv.Messages() {
		var e event.Event
		require.NoError(tb, json.Unmarshal(m.Data, &e))
		out[e.EventID]++
	}
	return out
}

// TestBackfillEnqueuesTheHistoryOfAnUpgradedDatabase: a database that
// captured 2,500 events at protocol 3 (half acknowledged, 500 of them
// verified) and was upgraded to protocol 4 is backfilled in pages: a
// delivery row for every event, the acknowledged ones accepted (and the
// verified ones verified, as verified_count says), and only what was never
// acknowledged drained. While the SDK's baseline is incomplete, backfill
// and replay refuse and change nothing.
func TestBackfillEnqueuesTheHistoryOfAnUpgradedDatabase(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4, withTemplate(&sdkfixture.V3Template))
	r.products(t, 2500)
	_, err := r.pool.Exec(r.ctx, `INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at, verified_at)
		SELECT $1::uuid, id, now(), CASE WHEN row_number() OVER (ORDER BY id) <= 500 THEN now() END
		FROM (SELECT id FROM product_history WHERE replication IS NOT NULL ORDER BY id LIMIT 1250) h`, r.gen.Generation)
	require.NoError(t, err)
	require.NoError(t, sdkfixture.Upgrade(r.ctx, r.pool, sdkfixture.Demo))

	_, err = r.pool.Exec(r.ctx, "UPDATE _ontology_replication_targets SET baseline_complete = false")
	require.NoError(t, err)
	_, err = r.svc.Backfill(r.ctx, "w1", delivery.PagesOptions{})
	require.ErrorIs(t, err, store.ErrBaselineIncomplete)
	_, err = r.svc.Replay(r.ctx, "w1", delivery.PagesOptions{})
	require.ErrorIs(t, err, store.ErrBaselineIncomplete)
	require.Zero(t, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery"))
	_, err = r.pool.Exec(r.ctx, "UPDATE _ontology_replication_targets SET baseline_complete = true")
	require.NoError(t, err)

	res, err := r.svc.Backfill(r.ctx, "w1", delivery.PagesOptions{})
	require.NoError(t, err)
	require.Equal(t, 2500, res.Rows)
	require.Greater(t, res.Pages, 1, "in pages")
	require.EqualValues(t, 2500, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery"))
	require.EqualValues(t, 500, r.count(t, "SELECT verified_count FROM _ontology_replication_targets"))
	require.EqualValues(t, 1, r.count(t, "SELECT count(*) FROM _ontology_replication_targets WHERE backfill_complete"))
	require.Len(t, r.publishedTimes(t), 1250, "only what was never acknowledged is drained")
	require.Zero(t, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}

// TestReplayPublishesEveryEventAgain: a whole-generation replay sends every
// event back to pending and drains it: each published once more, none
// left pending, the replay complete and verified_count back to zero.
func TestReplayPublishesEveryEventAgain(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	r.products(t, 250)
	r.drainAll(t)
	r.verify(t, delivery.VerifyAllOptions{})
	require.EqualValues(t, 250, r.count(t, "SELECT verified_count FROM _ontology_replication_targets"))
	res, err := r.svc.Replay(r.ctx, "w1", delivery.PagesOptions{})
	require.NoError(t, err)
	require.Equal(t, 250, res.Rows)
	require.Equal(t, 250, res.Drained.Published)
	times := r.publishedTimes(t)
	require.Len(t, times, 250)
	for id, n := range times {
		require.Equal(t, 2, n, "event %s published once more by the replay", id)
	}
	require.Zero(t, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
	require.EqualValues(t, 1, r.count(t, "SELECT count(*) FROM _ontology_replication_targets WHERE replay_complete AND verified_count = 0"))
}

// TestOperationsRetryTheirSetUp: a transient fault before an operation's
// first page (here a lock timeout on the targets, as a failover's ended
// session or a busy moment would give) is retried like its pages' faults,
// and the operation finishes: the whole replay and the partial one.
func TestOperationsRetryTheirSetUp(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"replay", "partial replay"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			var logs logbuf.Buffer
			r := newRig(t, 4, withStore(store.Config{LockTimeout: 100 * time.Millisecond}),
				withService(func(c *delivery.Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) }))
			r.products(t, 30)
			_, err := r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{})
			require.NoError(t, err)

			lock, err := r.pool.Begin(r.ctx)
			require.NoError(t, err)
			_, err = lock.Exec(r.ctx, "LOCK TABLE _ontology_replication_targets IN ACCESS EXCLUSIVE MODE")
			require.NoError(t, err)
			done := make(chan error, 1)
			go func() {
				var err error
				if op == "replay" {
					_, err = r.svc.Replay(r.ctx, "w1", delivery.PagesOptions{})
				} else {
					_, err = r.svc.ReplayPartial(r.ctx, "w1", delivery.PagesOptions{}, delivery.ReplaySelection{Entities: []string{"product"}})
				}
				done <- err
			}()
			t.Cleanup(func() { _ = lock.Rollback(context.Background()) })
			awaitLogged(t, &logs, "a transient fault; retrying", done, "the operation (its set-up's lock timeout retried)")
			require.NoError(t, lock.Rollback(r.ctx))
			require.NoError(t, await.Receive(t, done, "done"))
			for id, n := range r.publishedTimes(t) {
				require.Equal(t, 2, n, "event %s published again", id)
			}
		})
	}
}
