package delivery_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
	"github.com/segmentstream/ontology-replication/shared/testbench/logbuf"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestReadsRideOutATransientFault: the operator's reads (status, the
// set-aside list, views, audit) retry a transient fault under the
// command's retry policy, as the drains and pages do: here a lock timeout
// behind a migration that holds the replication singleton, released after
// the first failure.
func TestReadsRideOutATransientFault(t *testing.T) {
	t.Parallel()
	var logs logbuf.Buffer
	r := newRig(t, 2, withStore(store.Config{LockTimeout: 200 * time.Millisecond}), withService(func(c *delivery.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		c.Retry = delivery.RetryPolicy{Initial: 50 * time.Millisecond}
	}))
	reads := []struct {
		name string
		read func(ctx context.Context) error
	}{
		{"status", func(ctx context.Context) error { _, err := r.svc.Status(ctx, "w1", "", 10); return err }},
		{"set-aside", func(ctx context.Context) error { _, err := r.svc.SetAsideEvents(ctx, "w1", 10, false); return err }},
	}
	for _, rd := range reads {
		t.Run(rd.name, func(t *testing.T) {
			migration, err := r.pool.Begin(r.ctx)
			require.NoError(t, err)
			defer func() { _ = migration.Rollback(r.ctx) }()
			_, err = migration.Exec(r.ctx, `LOCK TABLE _ontology_replication IN ACCESS EXCLUSIVE MODE`)
			require.NoError(t, err)
			before := strings.Count(logs.String(), "a transient fault; retrying")
			done := make(chan error, 1)
			go func() { done <- rd.read(r.ctx) }()
			for strings.Count(logs.String(), "a transient fault; retrying") == before {
				select {
				case err := <-done:
					t.Fatalf("the read ended before it met the lock: %v", err)
				case <-time.After(10 * time.Millisecond): // the log line is the signal
				}
			}
			require.NoError(t, migration.Rollback(r.ctx))
			require.NoError(t, await.Receive(t, done, "done"), "the retry after the migration succeeds")
		})
	}
}

// stopAtFirstRows stops an operation after its first page that had rows,
// by ending its context.
type stopAtFirstRows struct{ cancel context.CancelFunc }

func (s stopAtFirstRows) Start(string, string, string, int64) delivery.Tracker { return s }
func (s stopAtFirstRows) Add(rows int) {
	if rows > 0 {
		s.cancel()
	}
}
func (s stopAtFirstRows) Done(error) {}

// TestStatusShowsAReplayInProgressByEntity: while a replay's pages run
// (here one stopped after its first page), status says how far they went
// in each entity's events; once it is done, nothing.
func TestStatusShowsAReplayInProgressByEntity(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	r.products(t, 1500)
	_, err := r.w.Create(r.ctx, "customer", map[string]any{"name": "Ada", "email": "ada@example.com"})
	require.NoError(t, err)
	r.drainAll(t)

	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	_, err = r.svc.Replay(ctx, "w1", delivery.PagesOptions{Progress: stopAtFirstRows{cancel}})
	require.ErrorIs(t, err, delivery.ErrInterrupted)
	st, err := r.svc.Status(r.ctx, "w1", "", 0)
	require.NoError(t, err)
	byEntity := map[string]delivery.EntityProgress{}
	var done int64
	for _, p := range st.ReplayProgress {
		byEntity[p.Entity] = p
		done += p.Done
	}
	require.EqualValues(t, store.ReplayPageSize, done, "one page sent back")
	require.EqualValues(t, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE history_table = 'product_history'"), byEntity["product"].Total)
	require.EqualValues(t, 1, byEntity["customer"].Total, "entities by name")
	require.EqualValues(t, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"), done,
		"what the page made pending")

	_, err = r.svc.Replay(r.ctx, "w1", delivery.PagesOptions{})
	require.NoError(t, err)
	st, err = r.svc.Status(r.ctx, "w1", "", 0)
	require.NoError(t, err)
	require.Nil(t, st.ReplayProgress, "no replay runs")
}

// TestStatusShowsABackfillInProgressByEntity: while the backfill of a
// database upgraded from protocol 3 runs (here stopped after its first
// page of events), status says how many of the baselines and of each entity's
// events it has enqueued, of all; once it is done, nothing.
func TestStatusShowsABackfillInProgressByEntity(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4, withTemplate(&sdkfixture.V3Template))
	r.products(t, 1500)
	require.NoError(t, sdkfixture.Upgrade(r.ctx, r.pool, sdkfixture.Demo))

	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	res, err := r.svc.Backfill(ctx, "w1", delivery.PagesOptions{Progress: stopAtFirstRows{cancel}})
	require.ErrorIs(t, err, delivery.ErrInterrupted)
	st, err := r.svc.Status(r.ctx, "w1", "", 0)
	require.NoError(t, err)
	byEntity := map[string]delivery.EntityProgress{}
	var done, total int64
	for _, p := range st.BackfillProgress {
		byEntity[p.Entity] = p
		done, total = done+p.Done, total+p.Total
	}
	require.EqualValues(t, res.Rows, done, "what the page enqueued")
	require.EqualValues(t, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery"), done)
	require.EqualValues(t, 1500, byEntity["product"].Total)
	require.EqualValues(t, store.ReplayPageSize, byEntity["product"].Done, "a page of products: %+v, %d rows in %d pages", st.BackfillProgress, res.Rows, res.Pages)
	require.EqualValues(t, r.count(t, "SELECT count(*) FROM _ontology_replication_baselines"), byEntity["baselines"].Total)
	require.Less(t, done, total)

	_, err = r.svc.Backfill(r.ctx, "w1", delivery.PagesOptions{})
	require.NoError(t, err)
	st, err = r.svc.Status(r.ctx, "w1", "", 0)
	require.NoError(t, err)
	require.Nil(t, st.BackfillProgress, "no backfill runs")
}

// TestStatusShowsAHeldTurn: a session that holds the workspace's next turn
// (a drainer frozen during its gathering) while another drainer waits for
// it shows in the status once held TurnHeldAfter, with the drainers
// waiting.
func TestStatusShowsAHeldTurn(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2, busy(func(c *delivery.Config) { c.TurnWait = time.Minute }))
	frozen := r.holdNextTurn(t, "frozen-drain")
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "behind the frozen drain"})
	require.NoError(t, err)
	r.wakeOK(t, r.svc)
	r.awaitTurnWaits(t, 1)
	deadline := time.Now().Add(time.Minute)
	var st delivery.WorkspaceStatus
	for {
		st, err = r.svc.Status(r.ctx, "w1", "", 10)
		require.NoError(t, err)
		if len(st.TurnsHeld) > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "no held turn reported")
		time.Sleep(100 * time.Millisecond) // until the wait passes TurnHeldAfter
	}
	h := st.TurnsHeld[0]
	require.Equal(t, "next", h.Role)
	require.Equal(t, "frozen-drain", h.Application)
	require.Equal(t, 1, h.Waiting)
	require.GreaterOrEqual(t, h.HeldSeconds, delivery.TurnHeldAfter.Seconds())
	_, err = frozen.Exec(r.ctx, `SELECT pg_advisory_unlock_all()`)
	require.NoError(t, err)
	r.settle(t)
	require.Zero(t, r.pendingCount(t))
}
