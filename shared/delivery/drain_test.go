package delivery_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// writerLatency commits one SDK write (a product) and returns how long the
// SDK's transaction took.
func (r *rig) writerLatency(tb testing.TB) time.Duration {
	tb.Helper()
	started := time.Now()
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "written by the SDK"})
	require.NoError(tb, err)
	return time.Since(started)
}

// baselineLatency is the slowest of a few SDK writes with no drain running.
func (r *rig) baselineLatency(tb testing.TB) time.Duration {
	tb.Helper()
	var worst time.Duration
	for range 5 {
		worst = max(worst, r.writerLatency(tb))
	}
	return worst
}

// pause is the SDK's pauseReplication at protocol 4 (the singleton, then the
// lifecycle lock exclusively), which waits for every shared holder.
func (r *rig) pause(ctx context.Context) error { return sdkfixture.Pause(ctx, r.pool) }

func (r *rig) resume(tb testing.TB) {
	tb.Helper()
	_, err := r.pool.Exec(r.ctx, "UPDATE _ontology_replication SET enabled = true WHERE id")
	require.NoError(tb, err)
}

// acceptedCount is how many delivery rows are accepted.
func (r *rig) acceptedCount(tb testing.TB) int64 {
	tb.Helper()
	return r.count(tb, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL")
}

// requireEachAcknowledgedOnce drains what is left and checks that every
// event is accepted, with one receipt, and was published exactly once.
func (r *rig) requireEachAcknowledgedOnce(tb testing.TB, svc *delivery.Service) {
	tb.Helper()
	_, err := svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{})
	require.NoError(tb, err)
	require.Zero(tb, r.count(tb, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
	events := r.count(tb, "SELECT count(*) FROM _ontology_replication_delivery")
	require.Equal(tb, events, r.count(tb, "SELECT count(*) FROM _ontology_replication_receipts"))
	require.Len(tb, r.srv.Messages(), int(events), "each event published once")
}

// TestSlowPublishDoesNotHoldTheSDK: while a drainer's publish hangs, the
// SDK's pause (the lifecycle lock, exclusively) goes through at once, and
// SDK writers queued behind it take no longer than without the drain; then
// everything is delivered, each event once.
func TestSlowPublishDoesNotHoldTheSDK(t *testing.T) {
	t.Parallel()
	g := newGate()
	r := newRig(t, 2, withGate(g))
	require.NoError(t, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", 50, 50))
	baseline := r.baselineLatency(t)

	r.drainHeld(t, g) // the batch is out, its publish in flight

	// The pause and, queued behind it, a writer: neither waits for the publish.
	var wg sync.WaitGroup
	var pauseTook, writerTook time.Duration
	var pauseErr error
	wg.Go(func() {
		started := time.Now()
		pauseErr = r.pause(r.ctx)
		pauseTook = time.Since(started)
	})
	wg.Go(func() { writerTook = r.writerLatency(t) })
	wg.Wait()
	require.NoError(t, pauseErr)
	// Both ended while the publish is still held (it is let go only below):
	// neither waited for it. Their times are for the log, not the verdict.
	require.Zero(t, r.acceptedCount(t), "nothing acknowledged before the publish returned")
	t.Logf("pause %v, writer %v (baseline %v) while the publish was held", pauseTook, writerTook, baseline)

	g.release()
	r.settle(t)
	require.EqualValues(t, 55, r.acceptedCount(t), "the batch is acknowledged after the publish")
	r.resume(t)
	r.requireEachAcknowledgedOnce(t, r.svc)
}

// TestMigrationDuringPublish: a migration (the lifecycle lock exclusively,
// then ACCESS EXCLUSIVE on the delivery and receipts tables) runs while a
// drainer's batch is out, and holds its locks when the publish returns:
// the acknowledgement waits for it, nothing deadlocks, and nothing is lost
// or acknowledged that Pub/Sub did not accept.
func TestMigrationDuringPublish(t *testing.T) {
	t.Parallel()
	g := newGate()
	r := newRig(t, 2, withGate(g))
	require.NoError(t, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", 30, 30))
	r.drainHeld(t, g)

	quick, cancel := context.WithTimeout(r.ctx, 3*time.Second)
	defer cancel()
	migration, err := r.pool.Begin(quick)
	require.NoError(t, err)
	defer func() { _ = migration.Rollback(r.ctx) }()
	for _, q := range []string{
		"SELECT id FROM _ontology_replication WHERE id FOR UPDATE",
		"SELECT pg_advisory_xact_lock(hashtextextended('" + store.LifecycleLock + "', 0))",
		"ALTER TABLE _ontology_replication_delivery ADD COLUMN migrated int",
		"ALTER TABLE _ontology_replication_receipts ADD COLUMN migrated int",
	} {
		_, err := migration.Exec(quick, q)
		require.NoError(t, err, "the migration does not wait for the publish: %s", q)
	}
	g.release()
	// The acknowledgement waits for the migration's locks (the lifecycle
	// lock, or the tables' while its statements are prepared); past its
	// lock timeout it fails and the drainer claims again after a backoff.
	require.Eventually(t, func() bool {
		return r.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND application_name = 'ontology-replication'`) == 1
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, migration.Commit(r.ctx))
	r.settle(t)
	require.EqualValues(t, 30, r.acceptedCount(t))
	r.requireEachAcknowledgedOnce(t, r.svc)
}

// TestAcceptedAtIsAfterThePublish: a slow publish's events are accepted at
// the time the acknowledgement ran, after Pub/Sub answered.
func TestAcceptedAtIsAfterThePublish(t *testing.T) {
	t.Parallel()
	g := newGate()
	r := newRig(t, 2, withGate(g))
	require.NoError(t, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", 10, 10))
	r.drainHeld(t, g)
	var released time.Time
	require.NoError(t, r.pool.QueryRow(r.ctx, "SELECT clock_timestamp()").Scan(&released))
	g.release()
	r.settle(t)
	require.EqualValues(t, 10, r.count(t, `SELECT count(*) FROM _ontology_replication_delivery d JOIN _ontology_replication_receipts c USING (generation, event_id)
		WHERE d.accepted_at >= $1 AND d.next_verify_at = d.accepted_at AND c.accepted_at = d.accepted_at`, released))
}

// TestDrainKilledMidPublishIsTakenOver: a drainer whose publish is in
// flight loses it: its process stops and the stop's grace runs out (its
// batch is released, nothing acknowledged), or its claim's session is cut
// (its acknowledgement fails: it claims again and publishes the batch once
// more, a duplicate at most). Either way every event is published and
// acknowledged once; in the first, by another instance's drainer at once.
func TestDrainKilledMidPublishIsTakenOver(t *testing.T) {
	t.Parallel()
	for _, kill := range []string{"grace run out", "session cut"} {
		t.Run(kill, func(t *testing.T) {
			t.Parallel()
			g := newGate()
			r := newRig(t, 2, withGate(g))
			require.NoError(t, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", 20, 20))
			r.drainHeld(t, g)
			switch kill {
			case "grace run out":
				ctx, cancel := context.WithCancel(r.ctx)
				cancel()
				require.Error(t, r.svc.Shutdown(ctx), "the grace ran out with the batch out")
				_, err := r.wake(t, r.svc)
				require.ErrorIs(t, err, delivery.ErrShuttingDown)
				require.Zero(t, r.acceptedCount(t), "it acknowledged nothing")
				// Another instance takes the events as soon as the claim is gone.
				g.release()
				other := r.newService()
				r.wakeOK(t, other)
				r.settle(t, other)
			case "session cut":
				r.count(t, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted
					AND database = (SELECT oid FROM pg_database WHERE datname = current_database())) cut`)
				g.release()
				r.settle(t)
			}
			require.Zero(t, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
			require.EqualValues(t, 20, r.count(t, "SELECT count(*) FROM _ontology_replication_receipts"))
			ids := map[string]bool{}
			for _, m := range r.srv.Messages() {
				ids[string(m.Data)] = true
			}
			require.Len(t, ids, 20, "every event published; a duplicate at most for the lost batch")
		})
	}
}

// TestConcurrentDrainsPublishDisjointBatches: DrainAll's drains, and drains
// of other instances beside them, publish every event exactly once.
func TestConcurrentDrainsPublishDisjointBatches(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	require.NoError(t, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", 2000, 1000))
	var wg sync.WaitGroup
	for range 3 {
		svc := r.newService()
		wg.Go(func() {
			_, err := svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{Drains: 3})
			require.NoError(t, err)
		})
	}
	wg.Wait()
	r.requireEachAcknowledgedOnce(t, r.svc)
}

// TestAFailedClaimIsRetried: a drainer whose claim fails — the SDK's
// migration holds the lifecycle lock past the claim's lock_timeout — on a
// quiet workspace and on a busy one (on its turn) makes no promise while
// it backs off (a wake-up then is answered ErrDrainRetrying, 503, a
// transient fault), and claims again on its own once the migration ends:
// the promised commits and the deferred one are published with no other
// wake-up.
func TestAFailedClaimIsRetried(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"quiet", "busy"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, 2, withService(func(c *delivery.Config) {
				if mode == "busy" {
					c.QuietInterval = -1 // every claim takes turns
				}
				c.Store.LockTimeout = 200 * time.Millisecond
			}))
			require.NoError(t, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", 3, 3))
			migration := r.holdLifecycleLock(t, time.Hour)
			r.wakeOK(t, r.svc) // answered before the claim: a promise
			var deferred error
			require.Eventually(t, func() bool {
				_, err := r.wake(t, r.svc)
				deferred = err
				return err != nil
			}, time.Minute, 5*time.Millisecond, "a wake-up during the drainer's backoff is deferred")
			require.ErrorIs(t, deferred, delivery.ErrDrainRetrying)
			require.True(t, delivery.Transient(deferred), "a lock timeout is worth a retry: %v", deferred)
			require.Zero(t, r.acceptedCount(t))
			migration.end()
			r.settle(t)
			require.EqualValues(t, 3, r.acceptedCount(t), "published by the drainer that failed, with no other wake-up")
		})
	}
}
