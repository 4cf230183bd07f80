package store_test

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestClaimLeavesARowAcknowledgedAfterItsSnapshot: locks do not honour
// snapshots. The claim's statement is paused after it took its snapshot,
// before its try-locks; meanwhile the SDK acknowledges the head of the
// queue and commits. The statement then takes that event's claim lock (the
// acknowledgement holds none) and still sees the row pending in its
// snapshot, so only its recheck of the row's newest version keeps it from
// publishing the event again. A row updated meanwhile but still pending is
// claimed as any other. The pause is a row-level security policy of
// the claim's role whose function waits on a lock the test holds: it runs
// on the statement's first row, after the snapshot.
func TestClaimLeavesARowAcknowledgedAfterItsSnapshot(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"own connection", "session"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, &sdkfixture.V4Template)
			tg := e.start(t)
			e.products(t, 5)
			queue := e.queueOrder(t)
			paused, role := e.pausedStore(t)
			// A store's first claims read their events in a second
			// statement, a snapshot after the locks: one claim released
			// first, so that this one reads them in its own statement.
			_, _, warm, err := paused.ClaimActive(e.ctx)
			require.NoError(t, err)
			require.Equal(t, queue, warm.IDs())
			warm.Release(e.ctx)
			require.Equal(t, []string{"product_history"}, store.ReadTables(paused))
			var claim func(context.Context) (*store.Claim, error)
			if how == "session" {
				ss := e.openSession(t, paused) // before the pause: it reads the delivery rows
				claim = func(ctx context.Context) (*store.Claim, error) {
					_, _, c, err := ss.Next(ctx, nil, true)
					return c, err
				}
			} else {
				claim = func(ctx context.Context) (*store.Claim, error) {
					_, _, c, err := paused.ClaimActive(ctx)
					return c, err
				}
			}

			resume := e.pause(t)
			claimed := make(chan *store.Claim, 1)
			go func() {
				c, err := claim(e.ctx)
				if err != nil {
					t.Error(err)
				}
				claimed <- c
			}()
			e.awaitPaused(t, role)
			e.exec(t, store.SeedStateUpdates[0], tg.Generation, `["`+queue[0]+`"]`)
			e.exec(t, `UPDATE _ontology_replication_delivery SET next_verify_at = now() WHERE event_id = $1`, queue[1])
			resume()

			c := await.Receive(t, claimed, "claimed")
			require.NotNil(t, c)
			defer c.Release(e.ctx)
			require.Equal(t, queue[1:], c.IDs(), "the event acknowledged after the snapshot is not claimed; the one updated but still pending is")
			_, err = c.Finish(e.ctx, c.IDs(), nil)
			require.NoError(t, err)
			require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
			requireConsistent(t, e)
		})
	}
}

// pauseKey is the advisory lock (two keys) the pausing policy waits on.
const pauseKey = "4242, 4242"

// pausedStore returns a store of a role of its own (its name returned too)
// whose every read of a delivery row first waits until the test's pause
// lock (see pause) is free: a row-level security policy on
// _ontology_replication_delivery for that role alone. The test's own
// connections, a superuser's, are not subject to it.
func (e *env) pausedStore(t *testing.T) (*store.Store, string) {
	t.Helper()
	role := "paused_" + strings.ToLower(strings.ReplaceAll(rand.Text(), "=", ""))
	password := rand.Text()
	ident := pgx.Identifier{role}.Sanitize()
	e.exec(t, "CREATE ROLE "+ident+" LOGIN PASSWORD '"+password+"'")
	t.Cleanup(func() {
		_, _ = e.pool.Exec(context.Background(), "DROP OWNED BY "+ident)
		_, _ = e.pool.Exec(context.Background(), "DROP ROLE "+ident)
	})
	e.exec(t, "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "+ident)
	e.exec(t, "GRANT SELECT, USAGE ON ALL SEQUENCES IN SCHEMA public TO "+ident)
	e.exec(t, `CREATE FUNCTION test_pause() RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
		BEGIN PERFORM pg_advisory_lock_shared(`+pauseKey+`); PERFORM pg_advisory_unlock_shared(`+pauseKey+`); RETURN true; END $$`)
	e.exec(t, `ALTER TABLE _ontology_replication_delivery ENABLE ROW LEVEL SECURITY`)
	e.exec(t, `CREATE POLICY test_pause ON _ontology_replication_delivery TO `+ident+` USING (test_pause()) WITH CHECK (true)`)
	cfg := e.pool.Config().Copy()
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, password
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	require.NoError(t, err)
	closeBounded(t, pool)
	st, err := store.New(pool, store.Config{})
	require.NoError(t, err)
	return st, role
}

// pause takes the pause lock on a connection of its own; the returned
// function lets it go.
func (e *env) pause(t *testing.T) (resume func()) {
	t.Helper()
	conn, err := e.pool.Acquire(e.ctx)
	require.NoError(t, err)
	_, err = conn.Exec(e.ctx, `SELECT pg_advisory_lock(`+pauseKey+`)`)
	require.NoError(t, err)
	released := false
	resume = func() {
		if released {
			return
		}
		released = true
		_, err := conn.Exec(e.ctx, `SELECT pg_advisory_unlock(`+pauseKey+`)`)
		require.NoError(t, err)
		conn.Release()
	}
	t.Cleanup(resume)
	return resume
}

// awaitPaused waits until a statement of role waits for the pause lock:
// the server's own view of its sessions (pg_locks), with a bound for a
// statement that never comes.
func (e *env) awaitPaused(t *testing.T, role string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		n := e.count(t, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE a.usename = $1 AND l.locktype = 'advisory' AND NOT l.granted AND l.classid = 4242 AND l.objid = 4242`, role)
		if n > 0 {
			var query string
			require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT query FROM pg_stat_activity WHERE usename = $1 AND wait_event = 'advisory'`, role).Scan(&query))
			require.True(t, strings.HasPrefix(query, "WITH candidates AS MATERIALIZED"), "paused in the candidates' statement, not in %s", query)
			return
		}
		require.True(t, time.Now().Before(deadline), "the claim's statement never reached the pause")
		time.Sleep(10 * time.Millisecond)
	}
}
