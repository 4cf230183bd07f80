package delivery_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
)

func TestVerifyRounds(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	r.products(t, 2500)
	r.drainAll(t)
	r.answer(t, everyID)
	res := r.verify(t, delivery.VerifyAllOptions{Budget: 5 * time.Minute})
	require.Equal(t, 3, res.Rounds, "2,500 due events: rounds of 1,000")
	require.Equal(t, 2500, res.Verified)
	require.EqualValues(t, 3, r.bq.Queries(), "one lookup per round")
}

// TestVerifierDiesMidRound: a round looks up, then verifies the present
// events in one transaction and retries the absent in another. Cut after
// the lookup (the verification cannot take its lock) nothing changes; cut
// between the two (the retry cannot take its lock) the present events stay
// verified and the absent untouched. Either way the next pass finishes the
// round: the absent events are retried, nothing is verified twice.
func TestVerifierDiesMidRound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		lock     string // held by a transaction of the test's own during the first pass
		verified int64  // after the first pass
	}{
		{"between lookup and verify", `SELECT 1 FROM _ontology_replication_targets FOR UPDATE`, 0},
		{"between verify and retry", `SELECT 1 FROM _ontology_replication_delivery WHERE event_id = $1::uuid FOR UPDATE`, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, 4, withService(func(c *delivery.Config) { c.Store.LockTimeout = time.Second }))
			r.products(t, 6)
			r.drainAll(t)
			rows, err := r.pool.Query(r.ctx, "SELECT event_id::text FROM _ontology_replication_delivery ORDER BY event_id LIMIT 2")
			require.NoError(t, err)
			absent, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			hidden := map[string]bool{}
			for _, id := range absent {
				hidden[event.ID(r.gen.SourceID, id, r.gen.Generation)] = true
			}
			var asked atomic.Int64
			r.answer(t, func(_ context.Context, q bqserver.Query) (bqserver.Result, error) {
				asked.Add(int64(len(q.Params["ids"].Values)))
				var present []string
				for _, id := range q.Params["ids"].Values {
					if !hidden[id] {
						present = append(present, id)
					}
				}
				return bqserver.Strings("event_id", present), nil
			})

			lock, err := r.pool.Begin(r.ctx)
			require.NoError(t, err)
			var args []any
			if strings.Contains(tc.lock, "$1") {
				args = append(args, absent[0])
			}
			_, err = lock.Exec(r.ctx, tc.lock, args...)
			require.NoError(t, err)
			res := r.verify(t, delivery.VerifyAllOptions{})
			require.NoError(t, lock.Rollback(r.ctx))
			require.Equal(t, delivery.OutcomeFailed, res.Outcome)
			require.EqualValues(t, 6, asked.Load(), "one lookup of every due event")
			require.Equal(t, tc.verified, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NOT NULL"))
			require.Equal(t, tc.verified, r.count(t, "SELECT verified_count FROM _ontology_replication_targets"))
			require.Zero(t, r.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE last_checked_at IS NOT NULL AND verified_at IS NULL"),
				"no absent event was retried")

			asked.Store(0)
			res = r.verify(t, delivery.VerifyAllOptions{})
			require.Equal(t, delivery.OutcomeVerified, res.Outcome, res)
			require.EqualValues(t, 6-tc.verified, asked.Load(), "the next pass looks up only what is still due")
			require.EqualValues(t, 4, r.count(t, "SELECT verified_count FROM _ontology_replication_targets"), "nothing verified twice")
			require.EqualValues(t, 2, r.count(t, `SELECT count(*) FROM _ontology_replication_delivery
				WHERE verified_at IS NULL AND last_checked_at IS NOT NULL AND next_verify_at = last_checked_at + interval '30 seconds'`), "the absent ones retried")
		})
	}
}
