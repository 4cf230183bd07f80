package store_test

import (
	"cmp"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// otherProcess is a second drain process on the same database: a Store
// over a pool of its own.
func otherProcess(t testing.TB, e *env) *store.Store {
	t.Helper()
	pool, err := pgxpool.New(e.ctx, e.pool.Config().ConnString())
	require.NoError(t, err)
	closeBounded(t, pool)
	st, err := store.New(pool, store.Config{})
	require.NoError(t, err)
	return st
}

// claimsAllAtOnce requires a claim of st to take every one of the n
// pending events at its first try, and releases it.
func claimsAllAtOnce(t testing.TB, e *env, st *store.Store, tg store.Target, n int) {
	t.Helper()
	c, err := st.Claim(e.ctx, tg)
	require.NoError(t, err)
	defer c.Release(e.ctx)
	require.Len(t, c.Events, n, "another process claims the events at once: no claim lock is left behind")
}

// waitUntilBlocked waits until a backend of the database waits on a lock
// in a statement that mentions what.
func waitUntilBlocked(t testing.TB, e *env, what string) int32 {
	t.Helper()
	var pid int32
	pollFor(t, "a statement like "+what+" to wait for a lock", func() bool {
		err := e.pool.QueryRow(e.ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%' AND pid <> pg_backend_pid() LIMIT 1`, what).Scan(&pid)
		if err == nil {
			return true
		}
		require.ErrorIs(t, err, pgx.ErrNoRows)
		return false
	})
	return pid
}

// TestClaimLeavesNoLockBehind: a claim that ends on any path (no event
// still pending among those it locked, an error after its locks, a
// cancellation, its connection lost) never leaves a claim lock on a
// connection: another process claims the events at once.
func TestClaimLeavesNoLockBehind(t *testing.T) {
	t.Parallel()
	const n = 5

	t.Run("every claimed row no longer pending", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, &sdkfixture.V4Template)
		tg := e.start(t)
		e.products(t, n)
		// An acknowledgement of every pending row is in flight: it holds
		// their row locks, so the claim locks them and then finds none of
		// them still pending.
		ack, err := e.pool.Begin(e.ctx)
		require.NoError(t, err)
		defer func() { _ = ack.Rollback(e.ctx) }()
		_, err = ack.Exec(e.ctx, `SELECT 1 FROM _ontology_replication_delivery WHERE accepted_at IS NULL FOR UPDATE`)
		require.NoError(t, err)
		_, _, c, err := e.store.ClaimActive(e.ctx)
		require.NoError(t, err)
		require.Empty(t, c.Events)
		c.Release(e.ctx)
		require.Empty(t, e.claimHolders(t), "no claim lock held once the claim has returned")
		require.NoError(t, ack.Rollback(e.ctx)) // the acknowledgement failed: the events are pending
		claimsAllAtOnce(t, e, otherProcess(t, e), tg, n)
	})

	// The claim's second statement (the events of a table its first did
	// not read) waits on the history table, which a migration holds.
	blocked := func(t *testing.T, cfg store.Config, during func(e *env, pid int32, cancel context.CancelFunc)) {
		e := newEnv(t, &sdkfixture.V4Template)
		tg := e.start(t)
		e.products(t, n)
		// The drain's pool: its sessions carry the store's timeouts, which
		// also bound pgx's preparation of a pipeline's statements.
		pcfg, err := pgxpool.ParseConfig(e.pool.Config().ConnString())
		require.NoError(t, err)
		pcfg.ConnConfig.RuntimeParams["lock_timeout"] = fmt.Sprintf("%dms", cmp.Or(cfg.LockTimeout, 5*time.Second).Milliseconds())
		pool, err := pgxpool.NewWithConfig(e.ctx, pcfg)
		require.NoError(t, err)
		closeBounded(t, pool)
		st, err := store.New(pool, cfg)
		require.NoError(t, err)
		migration, err := e.pool.Begin(e.ctx)
		require.NoError(t, err)
		defer func() { _ = migration.Rollback(e.ctx) }()
		_, err = migration.Exec(e.ctx, `LOCK TABLE product_history IN ACCESS EXCLUSIVE MODE`)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(e.ctx)
		defer cancel()
		done := make(chan error, 1)
		go func() {
			_, _, c, err := st.ClaimActive(ctx)
			if err == nil {
				c.Release(ctx)
			}
			done <- err
		}()
		pid := waitUntilBlocked(t, e, "product_history")
		during(e, pid, cancel)
		require.Error(t, await.Receive(t, done, "done"))
		require.NoError(t, migration.Rollback(e.ctx))
		// The server frees a terminated backend's locks as it exits.
		for len(e.claimHolders(t)) > 0 {
			time.Sleep(10 * time.Millisecond)
		}
		claimsAllAtOnce(t, e, otherProcess(t, e), tg, n)
	}
	t.Run("error after its locks", func(t *testing.T) {
		t.Parallel()
		blocked(t, store.Config{LockTimeout: 300 * time.Millisecond}, func(*env, int32, context.CancelFunc) {})
	})
	t.Run("cancelled", func(t *testing.T) {
		t.Parallel()
		blocked(t, store.Config{}, func(_ *env, _ int32, cancel context.CancelFunc) { cancel() })
	})
	t.Run("connection lost", func(t *testing.T) {
		t.Parallel()
		blocked(t, store.Config{}, func(e *env, pid int32, _ context.CancelFunc) {
			e.exec(t, `SELECT pg_terminate_backend($1)`, pid)
		})
	})
}

// TestClaimSettingsLastAsLongAsTheClaim: the idle_session_timeout a claim
// sets while it holds locks is back to the session's default when the
// connection returns to its pool, however the claim ended.
func TestClaimSettingsLastAsLongAsTheClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	pcfg, err := pgxpool.ParseConfig(e.pool.Config().ConnString())
	require.NoError(t, err)
	pcfg.MaxConns = 1 // every use takes the same connection
	pool, err := pgxpool.NewWithConfig(e.ctx, pcfg)
	require.NoError(t, err)
	closeBounded(t, pool)
	st, err := store.New(pool, store.Config{})
	require.NoError(t, err)
	idle := func() string {
		var v string
		require.NoError(t, pool.QueryRow(e.ctx, `SELECT current_setting('idle_session_timeout')`).Scan(&v))
		return v
	}
	require.Equal(t, "0", idle())
	for _, tc := range []struct {
		name  string
		claim func(t *testing.T)
	}{
		{"finished", func(t *testing.T) {
			e.products(t, 3)
			_, _, c, err := st.ClaimActive(e.ctx)
			require.NoError(t, err)
			require.Len(t, c.Events, 3)
			_, err = c.Acknowledge(e.ctx)
			require.NoError(t, err)
		}},
		{"released", func(t *testing.T) {
			e.products(t, 3)
			_, _, c, err := st.ClaimActive(e.ctx)
			require.NoError(t, err)
			require.Len(t, c.Events, 3)
			c.Release(e.ctx)
		}},
		{"nothing pending", func(t *testing.T) {
			e.drainAll(t, tg)
			_, _, c, err := st.ClaimActive(e.ctx)
			require.NoError(t, err)
			require.Empty(t, c.Events)
			c.Release(e.ctx)
		}},
		{"a session's claims", func(t *testing.T) {
			e.products(t, 3)
			_, _, ss, err := st.OpenSession(e.ctx)
			require.NoError(t, err)
			_, _, c, err := ss.Next(e.ctx, nil, true)
			require.NoError(t, err)
			require.Len(t, c.Events, 3)
			_, _, _, err = ss.Next(e.ctx, []store.Finishing{{Claim: c, Accepted: c.IDs()}}, false)
			require.NoError(t, err)
			ss.Close(e.ctx)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.claim(t)
			require.Equal(t, "0", idle(), "the claim's idle_session_timeout is not left on the pooled connection")
		})
	}
}

// TestFinishOfAnEmptyClaim: a claim that took no event has let its locks
// go already; finishing it with nothing is a no-op, as Claim says, and
// acknowledging events on it is refused.
func TestFinishOfAnEmptyClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	_, _, c, err := e.store.ClaimActive(e.ctx)
	require.NoError(t, err)
	require.NotNil(t, c)
	require.Empty(t, c.Events)
	require.True(t, c.Ended())
	n, err := c.Finish(e.ctx, nil, nil)
	require.NoError(t, err)
	require.Zero(t, n)
	_, err = c.Finish(e.ctx, []string{"0193b7a0-0000-7000-8000-000000000000"}, nil)
	require.ErrorContains(t, err, "the claim has ended")
}
