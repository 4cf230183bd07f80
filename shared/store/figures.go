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
	// SetAsideSince is when the longest set-aside event was first set
	// aside, at the latest (zero when none is): the time it was last set
	// aside less the backoffs it waited before (see setAsideSince).
	SetAsideSince time.Time `json:"set_aside_since,omitzero"`
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
// $5 holds, for each set-aside interval of $2, the backoffs an event set
// aside at that interval waited before it (Store.waitedBefore), from which
// set_aside_since is found.
// pending_rows walks _ontology_delivery_pending in claim order and
// unverified_rows _ontology_delivery_verify in due order, each LIMIT $3;
// the counts read the same indexes' entries only, LIMIT $4. $2 are the
// set-aside backoffs (see sqlSetAsideMarked).
var sqlFigures = `WITH pending_rows AS (
    SELECT next_verify_at, last_checked_at FROM _ontology_replication_delivery
     WHERE generation = $1::uuid AND accepted_at IS NULL
     ORDER BY revision, event_id LIMIT $3
  ), pending_aside AS (
    SELECT next_verify_at, last_checked_at, ` + sqlSetAsideInterval + ` AS interval_us, ` + setAsideMarked("$2") + ` AS aside
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
         (SELECT min(accepted_at) FROM unverified_rows) AS oldest_unverified,
         (SELECT min(a.last_checked_at - make_interval(secs => w.waited / 1000000.0))
            FROM pending_aside a JOIN unnest($2::bigint[], $5::bigint[]) AS w(interval_us, waited) USING (interval_us)
           WHERE a.aside) AS set_aside_since`

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
		var oldestPending, oldestUnverified, setAsideSince *time.Time
		var pendingRead, unverifiedRead int64
		if err := tx.QueryRow(ctx, sqlFigures, t.Generation, s.backoffs, MaxFigureRows, MaxFigureCount, s.waitedBefore).Scan(
			&f.Pending, &pendingRead, &f.SetAside, &oldestPending, &f.Unverified, &f.DueVerifications, &unverifiedRead, &oldestUnverified,
			&setAsideSince); err != nil {
			return err
		}
		if setAsideSince != nil {
			f.SetAsideSince = *setAsideSince
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
	return age(now, f.OldestPending), age(now, f.OldestUnverified)
}

// SetAsideAge returns how long the longest set-aside event has been set
// aside at now, at least (0 when none is).
func (f Figures) SetAsideAge(now time.Time) time.Duration { return age(now, f.SetAsideSince) }

func age(now, since time.Time) time.Duration {
	if since.IsZero() {
		return 0
	}
	return max(now.Sub(since), 0)
}

// waitedBefore returns, for each tagged set-aside interval of backoffs (in
// their order), the backoffs an event set aside at that interval has
// waited before: the sum of the shorter ones. An event whose backoff
// reached the longest may have waited at it any number of times; it is
// counted once, so the age found is a lower bound.
func waitedBefore(backoffs []int64) []int64 {
	out := make([]int64, len(backoffs))
	for i, b := range backoffs {
		level, _ := splitInterval(b)
		for _, c := range backoffs {
			if other, tag := splitInterval(c); tag == 0 && other < level {
				out[i] += other.Microseconds()
			}
		}
	}
	return out
}
