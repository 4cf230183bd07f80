package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Figures are a target's delivery and verification lags and backlogs, as
// the verifier reports them once a pass for metrics. They are read with
// bounded cost, whatever the history: counts from the partial indexes'
// entries (index-only), capped at MaxFigureCount; times and the set-aside
// split from the first MaxFigureRows outstanding rows in index order.
type Figures struct {
	// Pending counts events waiting to be published, set-aside ones not
	// included.
	Pending int64 `json:"pending"`
	// SetAside counts pending events set aside (from the first
	// MaxFigureRows pending rows in claim order).
	SetAside int64 `json:"set_aside"`
	// OldestPending is when the oldest pending event that is not set aside
	// was queued or sent back to pending (zero when none is).
	OldestPending time.Time `json:"oldest_pending,omitzero"`
	// Unverified counts events published and accepted but not verified yet.
	Unverified int64 `json:"unverified"`
	// DueVerifications counts those whose check is due now.
	DueVerifications int64 `json:"due_verifications"`
	// OldestUnverified is when the oldest accepted, unverified event was
	// accepted (zero when none is).
	OldestUnverified time.Time `json:"oldest_unverified,omitzero"`
	// Capped reports that a count reached MaxFigureCount (the true figure
	// is at least that), or that more than MaxFigureRows rows are
	// outstanding, so that the times and the set-aside count come from the
	// first MaxFigureRows of them (the oldest by claim order and by due
	// check, where the oldest almost always are).
	Capped bool `json:"capped,omitempty"`
}

// Bounds of a figures read.
const (
	// MaxFigureCount caps the counts (index-only scans of the partial
	// indexes _ontology_delivery_pending and _ontology_delivery_verify).
	MaxFigureCount = 1_000_000
	// MaxFigureRows bounds the rows whose columns the figures read.
	MaxFigureRows = 10_000
)

// sqlFigures is the store's own read (no seed statement gives lags): four
// bounded reads of the partial indexes, in one statement and snapshot.
// pending_rows walks _ontology_delivery_pending in claim order and
// unverified_rows _ontology_delivery_verify in due order, each LIMIT $3;
// the counts read the same indexes' entries only, LIMIT $4. $2 are the
// set-aside backoffs (see sqlSetAsideMarked).
var sqlFigures = `WITH pending_rows AS (
    SELECT next_verify_at, last_checked_at FROM _ontology_replication_delivery
     WHERE generation = $1::uuid AND accepted_at IS NULL
     ORDER BY revision, event_id LIMIT $3
  ), pending_aside AS (
    SELECT next_verify_at, ` + setAsideMarked("$2") + ` AS aside
      FROM pending_rows
  ), unverified_rows AS (
    SELECT accepted_at, next_verify_at FROM _ontology_replication_delivery
     WHERE generation = $1::uuid AND accepted_at IS NOT NULL AND verified_at IS NULL
     ORDER BY next_verify_at, event_id LIMIT $3
  )
  SELECT (SELECT count(*) FROM (SELECT 1 FROM _ontology_replication_delivery
            WHERE generation = $1::uuid AND accepted_at IS NULL LIMIT $4) c) AS pending,
         (SELECT count(*) FROM pending_rows) AS pending_read,
         (SELECT count(*) FILTER (WHERE aside) FROM pending_aside) AS set_aside,
         (SELECT min(next_verify_at) FILTER (WHERE NOT aside) FROM pending_aside) AS oldest_pending,
         (SELECT count(*) FROM (SELECT 1 FROM _ontology_replication_delivery
            WHERE generation = $1::uuid AND accepted_at IS NOT NULL AND verified_at IS NULL LIMIT $4) c) AS unverified,
         (SELECT count(*) FROM (SELECT 1 FROM _ontology_replication_delivery
            WHERE generation = $1::uuid AND accepted_at IS NOT NULL AND verified_at IS NULL AND next_verify_at <= now() LIMIT $4) c) AS due,
         (SELECT count(*) FROM unverified_rows) AS unverified_read,
         (SELECT min(accepted_at) FROM unverified_rows) AS oldest_unverified`

// ErrNoFigures is Figures' answer at protocol 3, whose outstanding events
// are found only by scanning history and receipts: a figure read must not
// do that once a minute.
var ErrNoFigures = errors.New("store: protocol 3 keeps no figures that can be read without scanning history")

// Figures reads a target's figures (ErrNoFigures at protocol 3).
func (s *Store) Figures(ctx context.Context, t Target) (Figures, error) {
	if !t.UsesDelivery() {
		return Figures{}, ErrNoFigures
	}
	var f Figures
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var oldestPending, oldestUnverified *time.Time
		var pendingRead, unverifiedRead int64
		if err := tx.QueryRow(ctx, sqlFigures, t.Generation, s.backoffs, MaxFigureRows, MaxFigureCount).Scan(
			&f.Pending, &pendingRead, &f.SetAside, &oldestPending, &f.Unverified, &f.DueVerifications, &unverifiedRead, &oldestUnverified); err != nil {
			return err
		}
		f.Capped = f.Pending == MaxFigureCount || f.Unverified == MaxFigureCount || pendingRead == MaxFigureRows || unverifiedRead == MaxFigureRows
		f.Pending -= f.SetAside
		if oldestPending != nil {
			f.OldestPending = *oldestPending
		}
		if oldestUnverified != nil {
			f.OldestUnverified = *oldestUnverified
		}
		return nil
	})
	if err != nil {
		return Figures{}, fmt.Errorf("store: figures of %s: %w", t.Generation, err)
	}
	return f, nil
}

// Ages returns how long the oldest pending and the oldest unverified event
// have waited at now (0 when none waits).
func (f Figures) Ages(now time.Time) (pending, unverified time.Duration) {
	if !f.OldestPending.IsZero() {
		pending = max(now.Sub(f.OldestPending), 0)
	}
	if !f.OldestUnverified.IsZero() {
		unverified = max(now.Sub(f.OldestUnverified), 0)
	}
	return pending, unverified
}
