package delivery_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/registry"
)

// TestForEach: every workspace gets its result, in the order given, past a
// failing one; no more than parallel run at once; once ctx ends, the
// workspaces not begun are reported interrupted.
func TestForEach(t *testing.T) {
	t.Parallel()
	spaces := []registry.Workspace{{ID: "a"}, {ID: "b"}, {ID: "c"}, {ID: "d"}, {ID: "e"}}
	var running, most atomic.Int64
	boom := errors.New("boom")
	results := delivery.ForEach(t.Context(), spaces, 2, func(_ context.Context, ws registry.Workspace) (any, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if ws.ID == "b" {
			return nil, boom
		}
		return ws.ID + "!", nil
	})
	require.LessOrEqual(t, most.Load(), int64(2), "at most parallel at once")
	require.Len(t, results, 5)
	for i, r := range results {
		require.Equal(t, spaces[i].ID, r.Workspace, "in the order given")
		if r.Workspace == "b" {
			require.ErrorIs(t, r.Err, boom)
			continue
		}
		require.NoError(t, r.Err)
		require.Equal(t, r.Workspace+"!", r.Detail)
	}

	ctx, cancel := context.WithCancel(t.Context())
	results = delivery.ForEach(ctx, spaces, 1, func(_ context.Context, ws registry.Workspace) (any, error) {
		if ws.ID == "b" {
			cancel()
		}
		return nil, nil
	})
	require.NoError(t, results[0].Err)
	require.NoError(t, results[1].Err, "begun before ctx ended")
	for _, r := range results[2:] {
		require.ErrorIs(t, r.Err, delivery.ErrInterrupted, r.Workspace)
	}
}
