package store_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is one test's SDK database with an active generation.
type env struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	store *store.Store
	w     *sdkfixture.Writer
	gen   sdkfixture.Generation
}

func newEnv(t testing.TB, tpl *pgtest.Template) *env {
	t.Helper()
	ctx := context.Background()
	// Ten connections: enough for the tests that hold several claims at once.
	pool, err := pgxpool.New(ctx, pgtest.NewDatabase(t, tpl)+"&pool_max_conns=10")
	require.NoError(t, err)
	closeBounded(t, pool)
	st, err := store.New(pool, store.Config{})
	require.NoError(t, err)
	e := &env{ctx: ctx, pool: pool, store: st, w: sdkfixture.NewWriter(pool, sdkfixture.Demo)}
	return e
}

// start starts a generation (with the baseline of what exists now).
func (e *env) start(t testing.TB) store.Target {
	t.Helper()
	g, err := sdkfixture.StartGeneration(e.ctx, e.pool, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
	require.NoError(t, err)
	e.gen = g
	return e.target(t)
}

func (e *env) target(t testing.TB) store.Target {
	t.Helper()
	_, tg, err := e.store.ActiveTarget(e.ctx)
	require.NoError(t, err)
	return tg
}

// products creates n products, one commit each, and returns their ids.
func (e *env) products(t testing.TB, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		id, err := e.w.Create(e.ctx, "product", map[string]any{"title": "p", "price": float64(i), "stock": i})
		require.NoError(t, err)
		ids[i] = id
	}
	return ids
}

// productsBulk creates n products in commits of up to 1,000.
func (e *env) productsBulk(t testing.TB, n int) {
	t.Helper()
	for done := 0; done < n; {
		k := min(1000, n-done)
		require.NoError(t, e.w.Commit(e.ctx, func(c *sdkfixture.Change) error {
			for i := range k {
				if _, err := c.Create("product", map[string]any{"title": "bulk", "stock": done + i}); err != nil {
					return err
				}
			}
			return nil
		}))
		done += k
	}
}

func (e *env) count(t testing.TB, query string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, e.pool.QueryRow(e.ctx, query, args...).Scan(&n))
	return n
}

func (e *env) exec(t testing.TB, query string, args ...any) {
	t.Helper()
	_, err := e.pool.Exec(e.ctx, query, args...)
	require.NoError(t, err)
}

// drainAll claims and acknowledges until nothing is pending; it returns the
// history ids in publish order.
func (e *env) drainAll(t testing.TB, tg store.Target) []string {
	t.Helper()
	return drainWith(t, e, e.store, tg)
}

// drainWith is drainAll through another Store over the same database.
func drainWith(t testing.TB, e *env, st *store.Store, tg store.Target) []string {
	t.Helper()
	var all []string
	for {
		c, err := st.Claim(e.ctx, tg)
		require.NoError(t, err)
		if len(c.Events) == 0 {
			c.Release(e.ctx)
			return all
		}
		_, err = c.Acknowledge(e.ctx)
		require.NoError(t, err)
		all = append(all, c.IDs()...)
	}
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// backoffsLiteral is a store's set-aside backoffs as a bigint[] literal
// without its braces, for EXPLAIN EXECUTE, which takes no bind parameters.
func backoffsLiteral(s *store.Store) string {
	return strings.Trim(strings.Join(strings.Fields(fmt.Sprint(store.Backoffs(s))), ","), "[]")
}

// genericPlan is the EXPLAIN of query's generic plan, the one a prepared
// statement runs under plan_cache_mode force_generic_plan: query is
// prepared with the parameter types (for example "uuid, text"), explained
// with the values as literals (EXECUTE takes no bind parameters), and
// deallocated, on a connection of the test's own.
func (e *env) genericPlan(t testing.TB, query, types, literals string) string {
	t.Helper()
	conn, err := e.pool.Acquire(e.ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(e.ctx, "PREPARE generic_plan ("+types+") AS "+query)
	require.NoError(t, err)
	defer conn.Exec(e.ctx, "DEALLOCATE generic_plan; RESET plan_cache_mode") //nolint:errcheck // the session is the test's
	_, err = conn.Exec(e.ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	rows, err := conn.Query(e.ctx, "EXPLAIN EXECUTE generic_plan ("+literals+")", pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(lines, "\n")
}

// closeBounded closes a test's pool when the test ends, once every
// connection was given back; a connection still out after 10 s (a turn or
// a claim that leaked it) fails the test naming it, instead of hanging in
// pgxpool.Close until the package's time-out.
func closeBounded(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	t.Cleanup(func() {
		deadline := time.Now().Add(10 * time.Second)
		for pool.Stat().AcquiredConns() > 0 {
			if time.Now().After(deadline) {
				t.Errorf("%d connections of the pool were never given back (a turn or a claim not ended): the pool is left open",
					pool.Stat().AcquiredConns())
				pool.Reset()
				return
			}
			time.Sleep(10 * time.Millisecond) // the pool's own count is the signal
		}
		pool.Close()
	})
}

// pollFor calls check every 5 ms until it reports true, for a minute at
// most: a condition that never comes fails the test naming what, instead
// of hanging until the package's time-out.
func pollFor(t testing.TB, what string, check func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !check() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute: %s", what)
		}
		time.Sleep(5 * time.Millisecond) // the condition (the server's lock table, say) is the signal
	}
}
