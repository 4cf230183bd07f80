package delivery_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/publish"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// TestVerifySharedTableIsOneLookup: workspaces sharing one events table
// are looked up together, ten to a query (VerifyUnitSize), each lookup
// asking for every member's generation, and the pass reports the queries
// saved.
func TestVerifySharedTableIsOneLookup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	_, err := srv.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/p1/topics/events"})
	require.NoError(t, err)
	var mu sync.Mutex
	var sizes []int
	bq := bqserver.New(func(_ context.Context, q bqserver.Query) (bqserver.Result, error) {
		mu.Lock()
		sizes = append(sizes, len(q.Params["generations"].Values))
		mu.Unlock()
		return bqserver.Strings("event_id", q.Params["ids"].Values), nil
	})
	bqHTTP := httptest.NewServer(bq)
	t.Cleanup(bqHTTP.Close)

	const n = 12
	pools := map[string]*pgxpool.Pool{}
	var entries []string
	for i := range n {
		id := fmt.Sprintf("s%02d", i)
		url := pgtest.NewDatabase(t, &sdkfixture.V4Template)
		pool, err := pgxpool.New(ctx, url)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		_, err = sdkfixture.StartGeneration(ctx, pool, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
		require.NoError(t, err)
		require.NoError(t, sdkfixture.BulkCreate(ctx, pool, sdkfixture.Demo, "product", "title", 7, 7))
		pools[id] = pool
		entries = append(entries, fmt.Sprintf(`{"id": %q, "database": {"url": %q, "max_conns": 2}, "pubsub": {"project": "p1", "topic": "events"},
			"bigquery": {"project": "p1", "dataset": "ontology_internal", "endpoint": %q}}`, id, url, bqHTTP.URL))
	}
	reg, err := registry.Parse([]byte(`{"workspaces": [` + strings.Join(entries, ",") + `]}`))
	require.NoError(t, err)
	dbs, err := database.New(database.Config{})
	require.NoError(t, err)
	t.Cleanup(dbs.Close)
	pub, err := publish.New(ctx, publish.Config{EmulatorHost: srv.Addr})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	wh, err := warehouse.NewBigQuery(warehouse.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = wh.Close() })
	svc, err := delivery.New(delivery.Config{Registry: reg, Pools: dbs, Publisher: pub, Warehouse: wh,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	for id := range pools {
		_, err := svc.DrainAll(ctx, id, delivery.DrainAllOptions{})
		require.NoError(t, err)
	}

	pass := svc.VerifyAll(ctx, delivery.VerifyAllOptions{})
	require.False(t, pass.Failed(), "%+v", pass)
	require.Len(t, pass.Workspaces, n)
	slices.Sort(sizes)
	require.Equal(t, []int{n - delivery.VerifyUnitSize, delivery.VerifyUnitSize}, sizes,
		"12 workspaces of one table: a lookup for ten, one for two, each asking for every member's generation")
	require.Equal(t, 2, pass.Lookups)
	require.Equal(t, n-2, pass.SharedLookups, "the queries saved")
	for _, r := range pass.Workspaces {
		require.Equal(t, 7, r.Verified, r.Workspace)
		var verified int
		require.NoError(t, pools[r.Workspace].QueryRow(ctx, "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NOT NULL").Scan(&verified))
		require.Equal(t, 7, verified, r.Workspace)
	}
}
