package delivery_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
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

// TestSlowPublishDoesNotHoldTheSDK: while a drain's publish hangs, the SDK's
// pause (the lifecycle lock, exclusively) goes through at once, and SDK
// writers queued behind it take no longer than without the drain; then
// everything is delivered, each event once.
func TestSlowPublishDoesNotHoldTheSDK(t *testing.T) {
	t.Parallel()
	g := newGate()
	r := newRig(t, 2, withPublishReactor(g))
	require.NoError(t, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", 50, 50))
	baseline := r.baselineLatency(t)

	drain := r.drainHeld(g) // the batch is out, its publish in flight

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
	select {
	case d := <-drain:
		t.Fatalf("the drain ended before its publish returned: %v", d.err)
	default:
	}
	t.Logf("pause %v, writer %v (baseline %v) while the publish was held", pauseTook, writerTook, baseline)

	g.release()
	d := await.Receive(t, drain, "drain")
	require.NoError(t, d.err, "the batch is acknowledged after the publish")
	require.Equal(t, 55, d.res.Published)
	r.resume(t)
	r.requireEachAcknowledgedOnce(t, r.svc)
}

// TestMigrationDuringPublish: a migration (the lifecycle lock exclusively,
// then ACCESS EXCLUSIVE on the delivery and receipts tables) runs while a
// drain's batch is out, and holds its locks when the publish returns: the
// acknowledgement waits for it, nothing deadlocks, and nothing is lost or
// acknowledged that Pub/Sub did not accept.
func TestMigrationDuringPublish(t *testing.T) {
	t.Parallel()
	g := newGate()
	r := newRig(t, 2, withPublishReactor(g))
	require.NoError(t, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", 30, 30))
	drain := r.drainHeld(g)

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
	// lock, or the tables' while its statements are prepared).
	require.Eventually(t, func() bool {
		return r.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND application_name = 'ontology-replication'`) == 1
	}, 10*time.Second, 5*time.Millisecond)
	select {
	case d := <-drain:
		t.Fatalf("the drain ended while the migration held its locks: %v", d.err)
	default:
	}
	require.NoError(t, migration.Commit(r.ctx))
	require.NoError(t, await.Receive(t, drain, "drain").err)
	r.requireEachAcknowledgedOnce(t, r.svc)
}

// TestAcceptedAtIsAfterThePublish: a slow publish's events are accepted at
// the time the acknowledgement ran, after Pub/Sub answered.
func TestAcceptedAtIsAfterThePublish(t *testing.T) {
	t.Parallel()
	g := newGate()
	r := newRig(t, 2, withPublishReactor(g))
	require.NoError(t, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", 10, 10))
	drain := r.drainHeld(g)
	var released time.Time
	require.NoError(t, r.pool.QueryRow(r.ctx, "SELECT clock_timestamp()").Scan(&released))
	g.release()
	require.NoError(t, await.Receive(t, drain, "drain").err)
	require.EqualValues(t, 10, r.count(t, `SELECT count(*) FROM _ontology_replication_delivery d JOIN _ontology_replication_receipts c USING (generation, event_id)
		WHERE d.accepted_at >= $1 AND d.next_verify_at = d.accepted_at AND c.accepted_at = d.accepted_at`, released))
}

// TestDrainKilledMidPublishIsTakenOver: a drain whose publish is in flight
// dies (its context is cancelled, or its claim's session is cut); another
// instance's drain publishes its events at once, and the dying drain
// acknowledges nothing.
func TestDrainKilledMidPublishIsTakenOver(t *testing.T) {
	t.Parallel()
	for _, kill := range []string{"cancelled", "session cut"} {
		t.Run(kill, func(t *testing.T) {
			t.Parallel()
			g := newGate()
			r := newRig(t, 2, withPublishReactor(g))
			require.NoError(t, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", 20, 20))
			g.hold()
			ctx, cancel := context.WithCancel(r.ctx)
			defer cancel()
			dying := make(chan drained, 1)
			go func() {
				res, err := r.svc.Drain(ctx, "w1")
				dying <- drained{res, err}
			}()
			<-g.entered
			switch kill {
			case "cancelled":
				cancel()
				require.Error(t, await.Receive(t, dying, "dying").err)
			case "session cut":
				var pid int32
				require.NoError(t, r.pool.QueryRow(r.ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted
					AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) LIMIT 1`).Scan(&pid))
				_, err := r.pool.Exec(r.ctx, "SELECT pg_terminate_backend($1)", pid)
				require.NoError(t, err)
			}
			// Another instance takes the events as soon as the claim is gone.
			other := r.newService()
			require.Eventually(t, func() bool {
				return r.count(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
					AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) == 0
			}, 10*time.Second, 5*time.Millisecond)
			g.release()
			res, err := other.Drain(r.ctx, "w1")
			require.NoError(t, err)
			require.Equal(t, 20, res.Published)
			if kill == "session cut" {
				// Its acknowledgement failed (the session is gone): a
				// transient fault, so it queued again and found nothing
				// left, having acknowledged nothing.
				out := await.Receive(t, dying, "dying")
				require.NoError(t, out.err)
				require.Zero(t, out.res.Published, "it acknowledged nothing")
				require.Positive(t, out.res.Requeued, "it queued again after the lost session")
			}
			require.Zero(t, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
			ids := map[string]bool{}
			for _, m := range r.srv.Messages() {
				ids[string(m.Data)] = true
			}
			require.Len(t, ids, 20, "every event published; a duplicate at most for the dying drain's batch")
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

// TestAFailedClaimOnATurnIsAnError: a wake-up on a busy workspace (it takes
// the drain's turn) whose claim fails — the SDK's migration holds the
// lifecycle lock past the claim's lock_timeout — answers the claim's error.
// It is neither taken for an empty claim nor a crash of the process.
func TestAFailedClaimOnATurnIsAnError(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2, withService(func(c *delivery.Config) {
		c.QuietInterval = -1 // every wake-up takes turns
		c.Store.LockTimeout = 200 * time.Millisecond
	}))
	require.NoError(t, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", 3, 3))
	migration, err := r.pool.Begin(r.ctx)
	require.NoError(t, err)
	defer func() { _ = migration.Rollback(r.ctx) }()
	_, err = migration.Exec(r.ctx, "SELECT pg_advisory_xact_lock(hashtextextended('"+store.LifecycleLock+"', 0))")
	require.NoError(t, err)
	res, err := r.svc.Drain(r.ctx, "w1")
	require.Error(t, err, "%+v", res)
	require.True(t, delivery.Transient(err), "a lock timeout is worth a retry: %v", err)
	require.Zero(t, res.Published)
	require.NoError(t, migration.Rollback(r.ctx))
	res, err = r.svc.Drain(r.ctx, "w1")
	require.NoError(t, err)
	require.Equal(t, 3, res.Published)
}
