package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/segmentstream/ontology-replication/shared/event"
)

// Ref names one accepted, unverified event: its history id (the delivery
// row's and receipt's event_id) and its wire event id (what BigQuery holds).
type Ref struct {
	HistoryID string
	EventID   string
	// AcceptedAt is when the event was acknowledged.
	AcceptedAt time.Time
}

// MaxVerifyBatch is how many due events one verification round takes.
const MaxVerifyBatch = 1000

// sqlDueUnverified is unverifiedReplicationEvents at protocol 4 (seed 000):
// accepted, unverified events whose next check is due, oldest check first,
// from the partial index _ontology_delivery_verify. It also returns
// accepted_at (the seed returns only the id), which bounds the BigQuery
// partitions a lookup reads.
const sqlDueUnverified = `SELECT event_id::text AS id, accepted_at FROM _ontology_replication_delivery
     WHERE generation = $1::uuid AND accepted_at IS NOT NULL AND verified_at IS NULL
       AND next_verify_at <= now() ORDER BY next_verify_at, event_id LIMIT 1000`

// sqlVerify is verifyReplicationEventsV4 (seed 000): the target row is locked
// first (FOR NO KEY UPDATE) so concurrent verifiers serialise their
// verified_count updates; delivery rows and receipts get verified_at. It
// returns the number of events verified (a RETURNING clause the seed's
// statement does not have). sqlRetry is retryUnverifiedReplicationV4 (seed
// 000): only ids that were checked and found absent; each is checked again in
// 30 seconds, and one accepted more than 15 minutes ago goes back to pending
// and loses its receipt. A verification backlog is never a delivery failure.
// Both write their state predicate and id list so that the rows are found by
// primary key (see Finding rows by key in the package doc); the seed's
// statements are in seed_test.go, and the tests run both.
const (
	sqlVerify = `WITH locked AS MATERIALIZED (
      SELECT generation FROM _ontology_replication_targets WHERE generation = $1::uuid FOR NO KEY UPDATE
    ), verified AS (
      UPDATE _ontology_replication_delivery SET verified_at = now(), last_checked_at = now()
      WHERE generation = (SELECT generation FROM locked) AND (CASE WHEN accepted_at IS NOT NULL AND verified_at IS NULL THEN true END)
        AND event_id = ANY (ARRAY(SELECT unnest($2::uuid[])))
      RETURNING event_id, verified_at
    ), receipts AS (
      UPDATE _ontology_replication_receipts r SET verified_at = v.verified_at FROM verified v
      WHERE r.generation = $1::uuid AND r.event_id = v.event_id
    ) UPDATE _ontology_replication_targets SET verified_count = verified_count + (SELECT count(*) FROM verified)
      WHERE generation = $1::uuid RETURNING (SELECT count(*) FROM verified)`
	sqlRetry = `WITH checked AS (
      UPDATE _ontology_replication_delivery SET last_checked_at = now(), next_verify_at = now() + interval '30 seconds',
        accepted_at = CASE WHEN accepted_at < now() - interval '15 minutes' THEN NULL ELSE accepted_at END
      WHERE generation = $1::uuid AND (CASE WHEN accepted_at IS NOT NULL AND verified_at IS NULL THEN true END)
        AND event_id = ANY (ARRAY(SELECT unnest($2::uuid[])))
      RETURNING event_id, accepted_at
    ), receipts AS (
      DELETE FROM _ontology_replication_receipts r USING checked c
      WHERE r.generation = $1::uuid AND r.event_id = c.event_id AND c.accepted_at IS NULL
    ) SELECT event_id::text FROM checked WHERE accepted_at IS NULL`
)

// DueUnverified returns up to MaxVerifyBatch accepted events to look up in
// the warehouse: at protocol 4 those whose check is due, on the legacy path
// every unverified receipt, oldest first.
func (s *Store) DueUnverified(ctx context.Context, t Target) ([]Ref, error) {
	query := sqlLegacyUnverified
	if t.UsesDelivery() {
		query = sqlDueUnverified
	}
	var refs []Ref
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, query, t.Generation)
		if err != nil {
			return err
		}
		var id string
		var accepted time.Time
		_, err = pgx.ForEachRow(rows, []any{&id, &accepted}, func() error {
			refs = append(refs, Ref{HistoryID: id, EventID: event.ID(t.SourceID, id, t.Generation), AcceptedAt: accepted})
			return nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: read due verifications of %s: %w", t.Generation, err)
	}
	return refs, nil
}

// VerifyEvents marks events seen in the warehouse as verified (history ids). It
// returns how many were newly verified (at protocol 4; on the legacy path,
// how many receipts were updated).
func (s *Store) VerifyEvents(ctx context.Context, t Target, historyIDs []string) (int64, error) {
	if len(historyIDs) == 0 {
		return 0, nil
	}
	var n int64
	err := s.inKeyOrderTx(ctx, func(tx pgx.Tx) error {
		if !t.DatabaseAtDelivery() {
			tag, err := tx.Exec(ctx, sqlLegacyVerify, t.Generation, idsJSON(historyIDs))
			n = tag.RowsAffected()
			return err
		}
		list, err := uuids(historyIDs)
		if err != nil {
			return err
		}
		err = tx.QueryRow(ctx, sqlVerify, t.Generation, list).Scan(&n)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrUnknownGeneration
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("store: verify %d events of %s: %w", len(historyIDs), t.Generation, err)
	}
	return n, nil
}

// RetryUnverified handles events that were looked up and found absent (history ids):
// at protocol 4 each is checked again in 30 seconds, and one accepted more
// than 15 minutes ago goes back to pending with its receipt deleted; on the
// legacy path only the latter (the receipt is deleted). It returns the
// history ids that went back to pending.
func (s *Store) RetryUnverified(ctx context.Context, t Target, missingHistoryIDs []string) ([]string, error) {
	if len(missingHistoryIDs) == 0 {
		return nil, nil
	}
	query, list := sqlLegacyRetry, any(nil)
	if t.DatabaseAtDelivery() {
		ids, err := uuids(missingHistoryIDs)
		if err != nil {
			return nil, fmt.Errorf("store: retry %d absent events of %s: %w", len(missingHistoryIDs), t.Generation, err)
		}
		query, list = sqlRetry, ids
	} else {
		list = idsJSON(missingHistoryIDs)
	}
	var requeued []string
	err := s.inKeyOrderTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, query, t.Generation, list)
		if err != nil {
			return err
		}
		requeued, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: retry %d absent events of %s: %w", len(missingHistoryIDs), t.Generation, err)
	}
	return requeued, nil
}
