package store_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// BenchmarkClaimCost drains 20,000 pending events of 1 KB through the store
// alone, on one connection, two ways: store, the drain function's
// (ClaimActive, then Finish of the whole batch: two round trips a batch),
// and session, the job's (a Session whose every round trip finishes a batch
// and claims the next), with nothing published between. Beside them, on
// the same connection, the floors: sdkfixture.FloorDrain (one statement
// per 100 events) and sdkfixture.FloorClaim then sdkfixture.FloorAccept
// (the least that could publish between reading and accepting). Each
// iteration runs all four, in an order that turns with the iteration, so
// that the machine's drift falls on them alike; it reports the server's
// CPU per 1,000 events of each and the store's ratios to the floors.
// Without Pub/Sub and the publish path the figure is the store's own cost
// in PostgreSQL, with less noise than BenchmarkJobCost's. (ns/op is one
// iteration: the four drains and the resets before them.)
// REPLICATION_BENCH_RETAINED=n puts n delivered and verified events before
// the pending ones.
func BenchmarkClaimCost(b *testing.B) {
	const events = 20_000
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.NewDatabase(b, &sdkfixture.V4Template)+"&pool_max_conns=1")
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	st, err := store.New(pool, store.Config{})
	require.NoError(b, err)
	g, err := sdkfixture.StartGeneration(ctx, pool, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
	require.NoError(b, err)
	if retained := os.Getenv("REPLICATION_BENCH_RETAINED"); retained != "" {
		// History delivered and verified before the pending events.
		n, err := strconv.Atoi(retained)
		require.NoError(b, err)
		require.NoError(b, sdkfixture.BulkCreate(ctx, pool, sdkfixture.Demo, "product", "title", n, 50_000))
		for _, q := range []string{`UPDATE _ontology_replication_delivery SET accepted_at = now(), verified_at = now()`,
			`INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at, verified_at)
			 SELECT generation, event_id, accepted_at, verified_at FROM _ontology_replication_delivery`} {
			_, err := pool.Exec(ctx, q)
			require.NoError(b, err)
		}
	}
	require.NoError(b, sdkfixture.BulkCreate(ctx, pool, sdkfixture.Demo, "product", "title", events, 50_000))
	require.NoError(b, sdkfixture.PadPayloads(ctx, pool, 800))
	var retainedUpTo int64 // the last revision of the retained history (0: none)
	require.NoError(b, pool.QueryRow(ctx, `SELECT coalesce(max(revision), 0) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL`).Scan(&retainedUpTo))
	for _, table := range []string{"_ontology_replication_delivery", "_ontology_replication_receipts", "_ontology_replication_targets"} {
		_, err := pool.Exec(ctx, `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`)
		require.NoError(b, err)
	}
	serverCPU := func() time.Duration {
		cpu, err := pgtest.ServerCPU(ctx, func(ctx context.Context) (pid int, err error) {
			err = pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)
			return pid, err
		})
		require.NoError(b, err)
		return cpu
	}
	drains := map[string]func() int{
		"store": func() int {
			n := 0
			for {
				_, _, c, err := st.ClaimActive(ctx)
				require.NoError(b, err)
				if c == nil || len(c.Events) == 0 {
					if c != nil {
						c.Release(ctx)
					}
					return n
				}
				_, err = c.Finish(ctx, c.IDs(), nil)
				require.NoError(b, err)
				n += len(c.Events)
			}
		},
		"session": func() int {
			_, _, ss, err := st.OpenSession(ctx)
			require.NoError(b, err)
			defer ss.Close(ctx)
			n := 0
			var finish []store.Finishing
			for {
				_, _, c, err := ss.Next(ctx, finish, true)
				require.NoError(b, err)
				if len(c.Events) == 0 {
					return n
				}
				n += len(c.Events)
				finish = []store.Finishing{{Claim: c, Accepted: c.IDs()}}
			}
		},
		"floor":     func() int { return floorDrain(b, pool, g.Generation, nil) },
		"floor-2tx": func() int { return floorDrain(b, pool, g.Generation, func([]string, [][]byte) error { return nil }) },
	}
	kinds := []string{"store", "session", "floor", "floor-2tx"}
	cpu := map[string]time.Duration{}
	i := 0
	for b.Loop() {
		for k := range kinds {
			kind := kinds[(i+k)%len(kinds)]
			// The pending events back to pending, their receipts gone, the
			// dead rows vacuumed: each drain starts from the same tables.
			for _, q := range []struct {
				sql  string
				args []any
			}{
				{`UPDATE _ontology_replication_delivery SET accepted_at = NULL, verified_at = NULL, next_verify_at = now(), last_checked_at = NULL
				   WHERE revision > $1`, []any{retainedUpTo}},
				{`DELETE FROM _ontology_replication_receipts r USING _ontology_replication_delivery d
				   WHERE d.generation = r.generation AND d.event_id = r.event_id AND d.revision > $1`, []any{retainedUpTo}},
				{`VACUUM ANALYZE`, nil},
				{`CHECKPOINT`, nil},
			} {
				_, err := pool.Exec(ctx, q.sql, q.args...)
				require.NoError(b, err)
			}
			before := serverCPU()
			require.Equal(b, events, drains[kind](), kind)
			cpu[kind] += serverCPU() - before
		}
		i++
	}
	per1000 := func(kind string) float64 { return cpu[kind].Seconds() * 1000 / float64(events*b.N) * 1000 }
	for _, kind := range kinds {
		b.ReportMetric(per1000(kind), kind+"-pg-cpu-ms/1000events")
	}
	for _, kind := range kinds[:2] {
		b.ReportMetric(per1000(kind)/per1000("floor"), kind+"/floor")
		b.ReportMetric(per1000(kind)/per1000("floor-2tx"), kind+"/floor-2tx")
	}
}

// floorDrain drains with sdkfixture.DrainWithFloor on one connection of
// pool (publish: see there), and returns how many events it took.
func floorDrain(tb testing.TB, pool *pgxpool.Pool, generation string, publish func([]string, [][]byte) error) int {
	tb.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(tb, err)
	defer conn.Release()
	n, err := sdkfixture.DrainWithFloor(ctx, conn.Conn(), generation, publish)
	require.NoError(tb, err)
	return int(n)
}
