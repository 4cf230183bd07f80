package store_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// finishedRows reads what a finish leaves on the delivery rows and
// receipts, timestamps reduced to which column equals which.
func finishedRows(t *testing.T, e *env, gen string) []string {
	t.Helper()
	rows, err := e.pool.Query(e.ctx, `SELECT d.event_id::text || ' accepted=' || (d.accepted_at IS NOT NULL)
	       || ' verify_at_accept=' || coalesce(d.next_verify_at = d.accepted_at, false)
	       || ' checked=' || (d.last_checked_at IS NOT NULL)
	       || ' backoff_us=' || coalesce(((extract(epoch FROM d.next_verify_at - d.last_checked_at) * 1000000)::bigint)::text, '-')
	       || ' receipt=' || (r.event_id IS NOT NULL)
	     FROM _ontology_replication_delivery d LEFT JOIN _ontology_replication_receipts r USING (generation, event_id)
	    WHERE d.generation = $1::uuid ORDER BY d.event_id`, gen)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// TestFinishIsTheTwoStatementsInOne: a batch with accepted and set-aside
// events, finished by the one statement, leaves what the acknowledgement
// and the set-aside leave when run one after the other (the store's two
// statements, which the seed's acknowledgement is compared with in
// TestStateUpdatesMatchTheSeed).
func TestFinishIsTheTwoStatementsInOne(t *testing.T) {
	t.Parallel()
	one, two := newEnv(t, &sdkfixture.V4Template), newEnv(t, &sdkfixture.V4Template)
	var results [][]string
	for i, e := range []*env{one, two} {
		tg := e.start(t)
		e.products(t, 6)
		c, err := e.store.Claim(e.ctx, tg)
		require.NoError(t, err)
		require.Len(t, c.Events, 6)
		ids := c.IDs()
		aside := []store.SetAside{{HistoryID: ids[1], Reason: store.ReasonRejected}, {HistoryID: ids[4], Reason: store.ReasonRejected}}
		accepted := []string{ids[0], ids[2], ids[3]} // ids[5] stays pending
		if i == 0 {
			n, err := c.Finish(e.ctx, accepted, aside)
			require.NoError(t, err)
			require.EqualValues(t, 3, n, "receipts written")
		} else {
			// The same through two claims: acknowledgement, then set-aside.
			c.Release(e.ctx)
			_, err := e.store.Acknowledge(e.ctx, tg, accepted)
			require.NoError(t, err)
			c, err = e.store.Claim(e.ctx, tg)
			require.NoError(t, err)
			_, err = c.Finish(e.ctx, nil, aside)
			require.NoError(t, err)
		}
		rows := finishedRows(t, e, tg.Generation)
		// Keys differ between the databases; what each row got does not.
		byKey := map[string]string{}
		for _, r := range rows {
			id, rest, _ := strings.Cut(r, " ")
			byKey[id] = rest
		}
		var got []string
		for _, id := range ids {
			got = append(got, byKey[id])
		}
		results = append(results, got)
		requireConsistent(t, e)
	}
	require.Equal(t, results[1], results[0])
	require.Contains(t, results[0][1], "backoff_us=60000000", "set aside for the first backoff")
	require.Contains(t, results[0][0], "accepted=true verify_at_accept=true")
	require.Contains(t, results[0][5], "accepted=false", "in neither list: still pending")
}

// claimSplit claims a batch and splits it so that the event set aside has
// a lower key than an accepted one: the order in which two key-ordered
// statements in one transaction deadlock with a third that locks both.
func claimSplit(t *testing.T, e *env, tg store.Target) (*store.Claim, string, []string) {
	t.Helper()
	c, err := e.store.Claim(e.ctx, tg)
	require.NoError(t, err)
	ids := c.IDs()
	require.GreaterOrEqual(t, len(ids), 2)
	sorted := slices.Clone(ids)
	slices.Sort(sorted) // uuid text order is the key order
	return c, sorted[0], sorted[1:]
}

// lockWaiters counts the sessions of this database waiting for a lock.
func lockWaiters(t *testing.T, e *env) int64 {
	return e.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)
}

// TestFinishCannotDeadlock: the interleavings that deadlocked while the
// acknowledgement and the set-aside were two statements. A blocker holds
// the lowest row of the batch; a replay page (or an operator's retry of the
// set-aside events) queues for it first, then the batch's finish. When the
// blocker lets go, the page takes the low row and wants the higher ones:
// had the finish locked its accepted (higher) rows before the set-aside
// (lower) one, each would wait for the other. Locked in one key order,
// the finish waits behind the page and both complete. Repeated, with the
// wait for each step a signal from the server (the session waiting on a
// lock), never a sleep.
func TestFinishCannotDeadlock(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, e *env, tg store.Target)
		third func(ctx context.Context, e *env, tg store.Target) error
	}{
		{
			name: "replay page",
			setup: func(t *testing.T, e *env, tg store.Target) {
				require.NoError(t, e.store.InitReplay(e.ctx, tg))
			},
			third: func(ctx context.Context, e *env, tg store.Target) error {
				_, err := e.store.AdvanceReplay(ctx, tg)
				return err
			},
		},
		{
			name: "retry of set-aside events",
			third: func(ctx context.Context, e *env, tg store.Target) error {
				_, err := e.store.RetrySetAside(ctx, tg)
				return err
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, &sdkfixture.V4Template)
			tg := e.start(t)
			for round := range 5 {
				e.exec(t, `UPDATE _ontology_replication_delivery SET accepted_at = NULL, verified_at = NULL, next_verify_at = now(), last_checked_at = NULL`)
				e.exec(t, `DELETE FROM _ontology_replication_receipts`)
				if round == 0 {
					e.products(t, 6)
				}
				claim, low, high := claimSplit(t, e, tg)
				if c.setup != nil {
					c.setup(t, e, tg)
				}
				if c.name == "retry of set-aside events" {
					// Every row of the batch marked set aside with its backoff
					// passed, as a claim takes them again: the retry wants them all.
					e.exec(t, `UPDATE _ontology_replication_delivery SET last_checked_at = now() - interval '2 minutes',
						next_verify_at = now() - interval '1 minute'`)
				}

				blocker, err := e.pool.Begin(e.ctx)
				require.NoError(t, err)
				_, err = blocker.Exec(e.ctx, `SELECT 1 FROM _ontology_replication_delivery WHERE generation = $1::uuid AND event_id = $2::uuid FOR UPDATE`, tg.Generation, low)
				require.NoError(t, err)

				third := make(chan error, 1)
				go func() { third <- c.third(e.ctx, e, tg) }()
				require.Eventually(t, func() bool { return lockWaiters(t, e) == 1 }, 30*time.Second, 5*time.Millisecond,
					"round %d: the %s waits for the blocked row", round, c.name)

				finished := make(chan error, 1)
				go func() {
					_, err := claim.Finish(e.ctx, high, []store.SetAside{{HistoryID: low, Reason: store.ReasonRejected}})
					finished <- err
				}()
				require.Eventually(t, func() bool { return lockWaiters(t, e) == 2 }, 30*time.Second, 5*time.Millisecond,
					"round %d: the finish waits too", round)

				require.NoError(t, blocker.Rollback(e.ctx))
				require.NoError(t, await.Receive(t, third, "third"), "round %d: the %s completes", round, c.name)
				require.NoError(t, await.Receive(t, finished, "finished"), "round %d: the finish completes", round)
				requireConsistent(t, e)
			}
		})
	}
}

// TestSetAsideBackoffDoublesForEveryReason: an event the store itself finds
// unpublishable (its history row gone) backs off as one Pub/Sub refuses:
// 1, 2, 4 minutes, and `attempts` counts them.
func TestSetAsideBackoffDoublesForEveryReason(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 2)
	var bad string
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT min(id::text) FROM product_history`).Scan(&bad))
	e.exec(t, `DELETE FROM product_history WHERE id = $1::uuid`, bad)
	for attempt, want := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute} {
		c, err := e.store.Claim(e.ctx, tg)
		require.NoError(t, err)
		require.Len(t, c.Unpublishable, 1, "attempt %d", attempt+1)
		_, err = c.Finish(e.ctx, c.IDs(), c.Unpublishable)
		require.NoError(t, err)
		rep, err := e.store.ReadSetAside(e.ctx, tg, 10, 10_000_000)
		require.NoError(t, err)
		require.Len(t, rep.Events, 1)
		require.Equal(t, want, rep.Events[0].NextAttempt.Sub(rep.Events[0].Since), "attempt %d", attempt+1)
		require.Equal(t, attempt+1, rep.Events[0].Attempts)
		require.Equal(t, store.ReasonMissingHistory, rep.Events[0].Reason)
		// Its backoff has passed: the next claim takes it again.
		e.exec(t, `UPDATE _ontology_replication_delivery SET last_checked_at = last_checked_at - $2::interval,
			next_verify_at = next_verify_at - $2::interval WHERE event_id = $1::uuid`, bad, want.String())
	}
}

// TestBackoffSettingsAvoidTheSeedsIntervals: no backoff the store can reach
// by doubling may equal the seed's 30 s recheck, which would read as a
// set-aside.
func TestBackoffSettingsAvoidTheSeedsIntervals(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		base, max time.Duration
		refused   string
	}{
		{"defaults", 0, 0, ""},
		{"base is the recheck", 30 * time.Second, time.Hour, "30s"},
		{"limit is the recheck", 10 * time.Second, 30 * time.Second, "30s"},
		{"doubling reaches it", 15 * time.Second, time.Hour, "reaches 30s"},
		{"doubling reaches it later", 7500 * time.Millisecond, time.Hour, "reaches 30s"},
		{"not whole milliseconds", 15*time.Second + 200*time.Microsecond, time.Hour, "whole milliseconds"},
		{"doubling passes it", 20 * time.Second, time.Hour, ""},
		{"limit below it", 5 * time.Second, 20 * time.Second, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := store.Config{SetAsideBackoff: c.base, SetAsideMaxBackoff: c.max}.Validate()
			if c.refused == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, c.refused)
			if strings.Contains(c.refused, "30s") {
				require.ErrorContains(t, err, "retryUnverifiedReplicationV4")
			}
		})
	}
}

// TestFinishLetsGoBeforeItsCommit: the acknowledgement of a claim of its
// own session (ClaimActive's, the drain's) lets its claim locks go in its
// own implicit transaction, before it commits. A claim made in that moment
// by another process takes none of its events (their rows are locked by
// the uncommitted update and skipped), and once it has committed every
// event is accepted once. A deferred constraint trigger on the receipts,
// which the test adds, holds the commit until the test lets it go.
func TestFinishLetsGoBeforeItsCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	e.products(t, 5)
	e.exec(t, `CREATE FUNCTION hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_advisory_xact_lock(7007); RETURN NULL; END $$`)
	e.exec(t, `CREATE CONSTRAINT TRIGGER hold_commit AFTER INSERT ON _ontology_replication_receipts
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION hold_commit()`)
	gate, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = gate.Rollback(e.ctx) }()
	_, err = gate.Exec(e.ctx, `SELECT pg_advisory_xact_lock(7007)`)
	require.NoError(t, err)

	_, _, c, err := e.store.ClaimActive(e.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { c.Release(context.Background()) })
	require.Len(t, c.Events, 5)
	acked := make(chan error, 1)
	go func() {
		n, err := c.Acknowledge(e.ctx)
		if err == nil && n != 5 {
			err = fmt.Errorf("%d receipts, want 5", n)
		}
		acked <- err
	}()
	for e.count(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 7007 AND NOT granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) == 0 {
		time.Sleep(5 * time.Millisecond) // polling the server's view of the wait: the signal itself
	}
	require.Empty(t, e.claimHolders(t), "the claim locks are gone before the acknowledgement commits")

	quick, cancel := context.WithTimeout(e.ctx, 10*time.Second) // a claim that waits on those rows would wait for the gate
	defer cancel()
	_, _, other, err := otherProcess(t, e).ClaimActive(quick)
	require.NoError(t, err)
	if other != nil {
		t.Cleanup(func() { other.Release(context.Background()) }) // before its pool closes
		require.Zero(t, len(other.Events), "no event of the uncommitted acknowledgement is claimed again")
		other.Release(e.ctx)
	}
	require.NoError(t, gate.Commit(e.ctx))
	require.NoError(t, await.Receive(t, acked, "acked"))
	require.Zero(t, e.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL`))
	require.EqualValues(t, 5, e.count(t, `SELECT count(*) FROM _ontology_replication_receipts`))
}
