package delivery_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
)

// TestVerifySharedTableIsOneLookup: workspaces sharing one events table
// are looked up together, ten to a query (VerifyUnitSize), each lookup
// asking for every member's generation, and the pass reports the queries
// saved.
func TestVerifySharedTableIsOneLookup(t *testing.T) {
	t.Parallel()
	const n = 12
	f := newFleetRig(t, n, 7)
	var mu sync.Mutex
	var sizes []int
	f.seen = func(q bqserver.Query) {
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, len(q.Params["generations"].Values))
	}
	svc := f.service(t, f.registry(t, true, 0))

	pass := svc.VerifyAll(context.Background(), delivery.VerifyAllOptions{})
	require.False(t, pass.Failed(), "%+v", pass)
	require.Len(t, pass.Workspaces, n)
	slices.Sort(sizes)
	require.Equal(t, []int{n - delivery.VerifyUnitSize, delivery.VerifyUnitSize}, sizes,
		"12 workspaces of one table: a lookup for ten, one for two, each asking for every member's generation")
	require.Equal(t, 2, pass.Lookups)
	require.Equal(t, n-2, pass.SharedLookups, "the queries saved")
	for _, r := range pass.Workspaces {
		require.Equal(t, 7, r.Verified, r.Workspace)
	}
	for i, url := range f.urls {
		pool, err := pgxpool.New(context.Background(), url)
		require.NoError(t, err)
		var verified int
		require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NOT NULL").Scan(&verified))
		pool.Close()
		require.Equal(t, 7, verified, fmt.Sprintf("w%05d", i))
	}
}
