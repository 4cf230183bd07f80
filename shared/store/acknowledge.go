package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// sqlAcknowledge is acknowledgeReplicationV4 (seed 000), run after the
// shared lifecycle lock in the same transaction: receipt foreign keys touch
// targets after delivery rows, so the shared lock drains acknowledgement
// before migration table locks. Only rows still pending are accepted, at
// the time the acknowledgement runs (after Pub/Sub accepted the batch); a
// lost publish response leaves the same ids pending, producing duplicates
// only. The state predicate and the id list are written so that the rows
// are found by primary key (see Finding rows by key in the package doc).
const sqlAcknowledge = `WITH accepted AS (
          UPDATE _ontology_replication_delivery SET accepted_at = now(), next_verify_at = now()
          WHERE generation = $1::uuid AND (CASE WHEN accepted_at IS NULL THEN true END)
            AND event_id = ANY (ARRAY(SELECT unnest($2::uuid[])))
          RETURNING event_id, accepted_at
        ) INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at)
          SELECT $1::uuid, event_id, accepted_at FROM accepted ON CONFLICT DO NOTHING`

// sqlSetAside is the store's own statement (no seed): it sets aside pending
// events that cannot be published ($2, each with its backoff in
// microseconds in $3), so that every claim skips them until then
// (sqlClaimable) and the events behind them flow. It writes two columns
// that no seed statement reads on a pending row: last_checked_at (now) and
// next_verify_at (now plus the backoff); the seed's pending read, its
// status and its readiness ignore both, and the seed's acknowledgement,
// retry and replay overwrite next_verify_at, which ends the set-aside. It
// runs in Finish's transaction, after the shared lifecycle lock, like the
// acknowledgement.
const sqlSetAside = `UPDATE _ontology_replication_delivery d SET last_checked_at = now(),
         next_verify_at = now() + (SELECT q.us FROM unnest($2::uuid[], $3::bigint[]) AS q(event_id, us)
                                    WHERE q.event_id = d.event_id LIMIT 1) * interval '1 microsecond'
       WHERE d.generation = $1::uuid AND (CASE WHEN d.accepted_at IS NULL THEN true END)
         AND d.event_id = ANY (ARRAY(SELECT unnest($2::uuid[])))`

// sqlFinish is sqlAcknowledge and sqlSetAside as one statement, for a
// batch that has both accepted and set-aside events ($2, each with its
// backoff in microseconds in $3, NULL for an accepted one). Two statements
// in one transaction each lock their rows in key order, but not across
// both: an acknowledgement that holds a high key waiting for a low one it
// sets aside, while a replay page (or RetrySetAside) holds that low key and
// waits for the high one, deadlocks. One UPDATE finds every row of the
// batch by primary key (the = ANY (ARRAY(…)) index condition walks the
// sorted list) and so locks them all in key order, as every other statement
// that updates a set of delivery rows does. An accepted row gets what
// sqlAcknowledge writes (accepted_at and next_verify_at now, a receipt), a
// set-aside row what sqlSetAside writes. Finish sends the two statements of
// one kind alone, as they are cheaper: each then locks one key-ordered set.
const sqlFinish = `WITH finished AS (
          UPDATE _ontology_replication_delivery d
             SET (accepted_at, next_verify_at, last_checked_at) = (
                   SELECT CASE WHEN q.us IS NULL THEN now() END,
                          now() + coalesce(q.us, 0) * interval '1 microsecond',
                          CASE WHEN q.us IS NULL THEN d.last_checked_at ELSE now() END
                     FROM unnest($2::uuid[], $3::bigint[]) AS q(event_id, us) WHERE q.event_id = d.event_id LIMIT 1)
           WHERE d.generation = $1::uuid AND (CASE WHEN d.accepted_at IS NULL THEN true END)
             AND d.event_id = ANY (ARRAY(SELECT unnest($2::uuid[])))
           RETURNING d.event_id, d.accepted_at
        ) INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at)
          SELECT $1::uuid, event_id, accepted_at FROM finished WHERE accepted_at IS NOT NULL ON CONFLICT DO NOTHING`

// Acknowledge marks events accepted after Pub/Sub accepted them, as the
// SDK's acknowledgeReplication does: at protocol 4 the delivery rows and
// their receipts, in one transaction under the shared lifecycle lock; on the
// legacy path the receipts. ids are history ids. It returns the number of
// receipts written.
func (s *Store) Acknowledge(ctx context.Context, t Target, ids []string) (int64, error) {
	var n int64
	err := s.retryRenamed(func() (err error) {
		n, err = s.acknowledgeOn(ctx, s.db, t, ids)
		return err
	})
	return n, err
}

// acknowledgeOn is Acknowledge in a transaction of db (the pool, or a
// claim's session).
func (s *Store) acknowledgeOn(ctx context.Context, db beginner, t Target, ids []string) (int64, error) {
	fail := func(err error) (int64, error) {
		return 0, fmt.Errorf("store: acknowledge %d events of %s: %w", len(ids), t.Generation, err)
	}
	delivery := t.DatabaseAtDelivery()
	query, list := sqlLegacyAcknowledge, any(nil)
	if delivery {
		uu, err := uuids(ids)
		if err != nil {
			return fail(err)
		}
		query, list = sqlAcknowledge, uu
	} else {
		list = idsJSON(ids)
	}
	var n int64
	err := s.inTxOnce(ctx, db, true, func(tx pgx.Tx) error {
		if delivery {
			if _, err := tx.Exec(ctx, sqlShareLifecycle, LifecycleLock); err != nil {
				return err
			}
		}
		tag, err := tx.Exec(ctx, query, t.Generation, list)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return fail(err)
	}
	return n, nil
}

// setAsideBackoffs returns the backoffs a set-aside can have, in
// microseconds: base, twice that, and so on, up to limit.
func setAsideBackoffs(base, limit time.Duration) []int64 {
	var out []int64
	for d := base; ; d *= 2 {
		if d >= limit {
			return append(out, limit.Microseconds())
		}
		out = append(out, d.Microseconds())
	}
}

// A set-aside's interval is its backoff, a whole number of milliseconds
// (Config.Validate), plus a tag of a few microseconds that keeps what the
// listing cannot find again from the event itself: 0 for every reason but
// ReasonPublishFailed, and 1 + its gRPC code (0–16) for that one. The
// store's backoffs (Store.backoffs, the set the statements compare
// intervals with) hold every tagged interval.

// maxReasonTag is the largest tag: ReasonPublishFailed with gRPC code 16.
const maxReasonTag = 17

// reasonTag is the tag of a set-aside's interval.
func reasonTag(a SetAside) int64 {
	if a.Reason != ReasonPublishFailed {
		return 0
	}
	return 1 + int64(min(max(a.Code, 0), maxReasonTag-1))
}

// splitInterval splits a set-aside interval (microseconds) into its
// backoff and its tag.
func splitInterval(us int64) (time.Duration, int64) {
	tag := us % 1000
	return time.Duration(us-tag) * time.Microsecond, tag
}

// taggedIntervals is every interval a set-aside can have: each backoff
// with each tag.
func taggedIntervals(backoffs []int64) []int64 {
	out := make([]int64, 0, len(backoffs)*(maxReasonTag+1))
	for _, b := range backoffs {
		for tag := int64(0); tag <= maxReasonTag; tag++ {
			out = append(out, b+tag)
		}
	}
	return out
}

// nextBackoff returns the backoff of an event set aside again after prior
// (0: set aside for the first time).
func (s *Store) nextBackoff(prior time.Duration) time.Duration {
	if prior < s.cfg.SetAsideBackoff {
		return s.cfg.SetAsideBackoff
	}
	return min(2*prior, s.cfg.SetAsideMaxBackoff)
}
