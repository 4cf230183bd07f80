package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestStatusDocumentCarriesTheHolds: `job status --json` carries what the
// delivery status reads, through the job's own document: a session
// holding the SDK's lifecycle lock exclusively (lifecycle_held, with the
// writers waiting behind it), a drain's next turn held 5 s or more with a
// drain waiting for it (turns_held), and a replay in progress
// (replay_progress, by entity).
func TestStatusDocumentCarriesTheHolds(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	h.start("w1")
	h.products("w1", 30)
	h.mustRun("drain")
	pool := h.spaces["w1"].pool
	ctx := h.ctx

	// A replay in progress: initialised, one page advanced.
	st, err := store.New(pool, store.Config{})
	require.NoError(t, err)
	_, tg, err := st.ActiveTarget(ctx)
	require.NoError(t, err)
	require.NoError(t, st.InitReplay(ctx, tg))

	// A frozen drain's next turn, and a drain waiting for it.
	holder, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock(hashtext($1), 2)`, store.DrainTurnClass)
	require.NoError(t, err)
	defer func() { _, _ = holder.Exec(ctx, `SELECT pg_advisory_unlock_all()`) }()
	waiter, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer waiter.Release()
	waited := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(ctx, `SELECT set_config('lock_timeout', '60s', false), pg_advisory_lock(hashtext($1), 2)`, store.DrainTurnClass)
		waited <- err
	}()

	// A migration holding the lifecycle lock, and an SDK writer behind it.
	release, err := sdkfixture.HoldLifecycleLock(ctx, pool)
	require.NoError(t, err)
	written := make(chan error, 1)
	go func() {
		_, err := h.spaces["w1"].w.Create(ctx, "product", map[string]any{"title": "waits"})
		written <- err
	}()

	deadline := time.Now().Add(time.Minute)
	var doc workspaceStatus
	for {
		doc = h.statusJSON("--workspace", "w1")[0]
		if doc.LifecycleHeld != nil && doc.LifecycleHeld.Waiting > 0 && len(doc.TurnsHeld) > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the holds never showed: %+v", doc)
		time.Sleep(200 * time.Millisecond) // until the turn's wait passes 5 s
	}
	require.NotEmpty(t, doc.LifecycleHeld.Holders)
	require.Equal(t, "next", doc.TurnsHeld[0].Role)
	require.Equal(t, 1, doc.TurnsHeld[0].Waiting)
	require.NotEmpty(t, doc.ReplayProgress, "the replay's progress by entity")
	release()
	require.NoError(t, <-written)
	_, _ = holder.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
	require.NoError(t, <-waited)
	_, _ = waiter.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
}
