package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestFortyWorkspacesWithinTheConnectionBudget: `job drain` and `job
// verify` over 40 workspaces whose databases share one PostgreSQL server
// with max_connections 100 both succeed, and the job's connections (this
// process's, the test's own pools being emptied first) never pass the
// documented bound: --parallel (4) pools of DATABASE_POOL_SIZE (4)
// connections.
func TestFortyWorkspacesWithinTheConnectionBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server of its own with 40 databases")
	}
	t.Parallel()
	ctx := context.Background()
	c, err := pgtest.Start(ctx, pgtest.Config{Disposable: true, Settings: map[string]string{"max_connections": "100"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	templates := make([]*pgtest.Template, 40)
	for i := range templates {
		templates[i] = &sdkfixture.V4Template
	}
	h := newHarnessOn(t, c, templates...)
	for i := range templates {
		id := fmt.Sprintf("w%d", i+1)
		h.start(id)
		h.products(id, 30)
		h.spaces[id].pool.Reset() // the test's own connections go
	}
	stop := c.WatchClientConnections(t)
	h.mustRun("drain")
	h.mustRun("verify", "--budget", "2m")
	peak := stop()
	t.Logf("peak connections of the job: %d", peak)
	require.LessOrEqual(t, peak, int64(4*4), "within --parallel × DATABASE_POOL_SIZE")
	require.Positive(t, peak)
	for i := range templates {
		id := fmt.Sprintf("w%d", i+1)
		require.Len(t, h.published(id), 30, id)
		require.EqualValues(t, 30, h.count(id, "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NOT NULL"), id)
		h.spaces[id].pool.Reset()
	}
}
