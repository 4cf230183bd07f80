package sdkfixture_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestCaptureAtEachProtocol(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		tpl      *pgtest.Template
		delivery bool
	}{{"v3", &sdkfixture.V3Template, false}, {"v4", &sdkfixture.V4Template, true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, err := pgxpool.New(ctx, pgtest.NewDatabase(t, c.tpl))
			require.NoError(t, err)
			defer pool.Close()
			w := sdkfixture.NewWriter(pool, sdkfixture.Demo)
			before, err := w.Create(ctx, "product", map[string]any{"title": "before", "price": 1.5, "stock": 3})
			require.NoError(t, err)
			g, err := sdkfixture.StartGeneration(ctx, pool, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
			require.NoError(t, err)
			require.Equal(t, 1, g.Baseline)
			cust, err := w.Create(ctx, "customer", map[string]any{"name": "Ada", "age": 36, "active": true,
				"signed_up_at": time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), "attributes": map[string]any{"vip": true}})
			require.NoError(t, err)
			order, err := w.Create(ctx, "order", map[string]any{"reference": "o-1", "customer_id": cust, "total": 9.5})
			require.NoError(t, err)
			require.NoError(t, w.Link(ctx, "order", "products", order, before))
			require.NoError(t, w.Update(ctx, "order", order, map[string]any{"paid": true}))
			require.NoError(t, w.Unlink(ctx, "order", "products", order, before))
			require.NoError(t, w.Delete(ctx, "customer", cust))
			var captured int
			require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM customer_history WHERE replication IS NOT NULL)
				+ (SELECT count(*) FROM order_history WHERE replication IS NOT NULL)`).Scan(&captured))
			require.Equal(t, 6, captured)
			var kinds []string
			require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(replication->>'record_kind' ORDER BY (replication->>'revision')::bigint) FROM order_history`).Scan(&kinds))
			require.Equal(t, []string{"entity", "edge:products", "entity", "edge:products"}, kinds)
			if c.delivery {
				var queued int
				require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM _ontology_replication_delivery WHERE generation = $1", g.Generation).Scan(&queued))
				require.Equal(t, 7, queued, "six captured events and one baseline event")
			}
			_, err = pool.Exec(ctx, "UPDATE product SET title = 'rogue'")
			require.ErrorContains(t, err, "compatible ontology writer", "the guard rejects writes outside the SDK writer")
		})
	}
}

func TestUpgradeMarksTargetForBackfill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.NewDatabase(t, &sdkfixture.V3Template))
	require.NoError(t, err)
	defer pool.Close()
	g, err := sdkfixture.StartGeneration(ctx, pool, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
	require.NoError(t, err)
	w := sdkfixture.NewWriter(pool, sdkfixture.Demo)
	for range 3 {
		_, err := w.Create(ctx, "product", map[string]any{"title": "p"})
		require.NoError(t, err)
	}
	require.NoError(t, sdkfixture.Upgrade(ctx, pool, sdkfixture.Demo))
	var complete bool
	var backfillRevision, seq int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT backfill_complete, backfill_revision FROM _ontology_replication_targets WHERE generation = $1", g.Generation).Scan(&complete, &backfillRevision))
	require.False(t, complete)
	require.Equal(t, int64(3), backfillRevision)
	_, err = w.Create(ctx, "product", map[string]any{"title": "after"})
	require.NoError(t, err)
	require.NoError(t, pool.QueryRow(ctx, "SELECT max(revision) FROM _ontology_replication_delivery").Scan(&seq))
	require.Equal(t, int64(4), seq, "v4 revisions continue after the legacy counter")
}
