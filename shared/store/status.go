package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Status is a target's delivery status.
type Status struct {
	// Total, Accepted and Verified count the target's events as the SDK's
	// replicationStatus does (at protocol 4: verified_count plus the
	// outstanding rows).
	Total, Accepted, Verified int64
	// Pending counts events not yet accepted.
	Pending int64
	// OldestPending is when the oldest pending event was queued or sent back
	// to pending (the delivery row's next_verify_at, which is set to now()
	// on each of those); zero when nothing is pending or at protocol 3,
	// which records no such time.
	OldestPending time.Time
	// DueVerifications counts accepted events whose warehouse check is due.
	DueVerifications int64
	// InitiallyReady is the SDK's replicationInitiallyReady; at protocol 3,
	// which has no such notion, it reports that every event is verified.
	InitiallyReady bool
}

// sqlStatus is replicationStatus at protocol 4 (seed 000): verified events
// are counted in verified_count, so only outstanding rows are scanned.
const sqlStatus = `SELECT (t.verified_count + outstanding.total) AS total,
      (t.verified_count + outstanding.accepted) AS accepted, t.verified_count AS verified
     FROM _ontology_replication_targets t CROSS JOIN LATERAL (
       SELECT count(*) AS total, count(accepted_at) AS accepted FROM _ontology_replication_delivery
       WHERE generation = t.generation AND verified_at IS NULL
     ) outstanding WHERE t.generation = $1::uuid`

// sqlOutstanding adds what an operator needs beyond the SDK's status: the
// pending count, the oldest pending row's queue time and the due checks,
// from the outstanding (unverified) rows only.
const sqlOutstanding = `SELECT count(*) FILTER (WHERE accepted_at IS NULL),
       min(next_verify_at) FILTER (WHERE accepted_at IS NULL),
       count(*) FILTER (WHERE accepted_at IS NOT NULL AND next_verify_at <= now())
     FROM _ontology_replication_delivery WHERE generation = $1::uuid AND verified_at IS NULL`

// sqlInitiallyReady is replicationInitiallyReady (seed 000): the fixed fence
// initial_revision keeps continuing writes from moving the goal.
const sqlInitiallyReady = `SELECT baseline_complete AND backfill_complete AND replay_complete AND NOT EXISTS (
      SELECT 1 FROM _ontology_replication_delivery d WHERE d.generation = t.generation
        AND d.verified_at IS NULL AND (d.is_baseline OR d.revision <= t.initial_revision)
    ) AS ready FROM _ontology_replication_targets t WHERE generation = $1::uuid`

// Status reports a target's delivery status.
func (s *Store) Status(ctx context.Context, t Target) (Status, error) {
	var status Status
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if !t.UsesDelivery() {
			events, err := s.legacyEvents(ctx, tx, t)
			if err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, fmt.Sprintf(sqlLegacyStatus, events), t.Generation, t.SourceID, t.FromRevision).
				Scan(&status.Total, &status.Accepted, &status.Verified); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, fmt.Sprintf(sqlLegacyPendingCount, events), t.Generation, t.SourceID, t.FromRevision).Scan(&status.Pending); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, sqlLegacyUnverifiedCount, t.Generation).Scan(&status.DueVerifications); err != nil {
				return err
			}
			status.InitiallyReady = status.Verified == status.Total
			return nil
		}
		if err := tx.QueryRow(ctx, sqlStatus, t.Generation).Scan(&status.Total, &status.Accepted, &status.Verified); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrUnknownGeneration
			}
			return err
		}
		var oldest *time.Time
		if err := tx.QueryRow(ctx, sqlOutstanding, t.Generation).Scan(&status.Pending, &oldest, &status.DueVerifications); err != nil {
			return err
		}
		if oldest != nil {
			status.OldestPending = *oldest
		}
		return tx.QueryRow(ctx, sqlInitiallyReady, t.Generation).Scan(&status.InitiallyReady)
	})
	if err != nil {
		return Status{}, fmt.Errorf("store: status of %s: %w", t.Generation, err)
	}
	return status, nil
}

// The remaining work of a replay or a backfill, counted once when a job
// starts so that its progress can show an ETA.
const (
	sqlReplayRemaining = `SELECT count(*) FROM _ontology_replication_delivery
     WHERE generation = $1::uuid AND ($2::uuid IS NULL OR event_id > $2::uuid) AND (is_baseline OR revision <= $3::bigint)`
	sqlBackfillRemainingBaselines = `SELECT count(*) FROM _ontology_replication_baselines WHERE generation = $1::uuid`
	// %s is the history table's quoted identifier.
	sqlBackfillRemainingHistory = `SELECT count(*) FROM %s WHERE replication IS NOT NULL
     AND replication->>'source_id' = $1 AND (replication->>'revision')::bigint > $2::bigint
     AND (replication->>'revision')::bigint <= $3::bigint`
)

// ReplayRemaining counts the delivery rows a replay in progress has still to
// reset (0 when none is in progress).
func (s *Store) ReplayRemaining(ctx context.Context, t Target) (int64, error) {
	if !t.UsesDelivery() || t.ReplayComplete || t.InitialRevision == nil {
		return 0, nil
	}
	var n int64
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, sqlReplayRemaining, t.Generation, t.ReplayCursor, *t.InitialRevision).Scan(&n)
	})
	if err != nil {
		return 0, fmt.Errorf("store: count replay rows of %s: %w", t.Generation, err)
	}
	return n, nil
}

// BackfillTotal counts the events a backfill of the target enqueues in all
// (baselines and history up to backfill_revision), done or not.
func (s *Store) BackfillTotal(ctx context.Context, t Target) (int64, error) {
	if !t.UsesDelivery() || t.BackfillComplete || t.BackfillRevision == nil {
		return 0, nil
	}
	var total int64
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, sqlBackfillRemainingBaselines, t.Generation).Scan(&total); err != nil {
			return err
		}
		for _, sel := range t.Selection {
			table, err := s.entityHistoryTable(ctx, tx, sel.EntityID)
			if err != nil {
				return err
			}
			ident, err := s.historyTable(ctx, tx, table)
			if err != nil {
				return err
			}
			var n int64
			if err := tx.QueryRow(ctx, fmt.Sprintf(sqlBackfillRemainingHistory, ident), t.SourceID, t.FromRevision, *t.BackfillRevision).Scan(&n); err != nil {
				return err
			}
			total += n
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("store: count backfill rows of %s: %w", t.Generation, err)
	}
	return total, nil
}

// EntityProgress is how far an operation went in one entity's events.
type EntityProgress struct {
	// EntityID names the entity (empty when its history table has no
	// capture trigger any more); HistoryTable is its history table.
	EntityID, HistoryTable string
	// Done counts the events the operation passed; Total those in its
	// scope.
	Done, Total int64
}

// sqlReplayProgress counts, per history table, the replay's events (the
// pages' scope: sqlReplayRemaining's) and those at or below the cursor,
// which the pages have made pending again.
const sqlReplayProgress = `SELECT history_table, count(*) FILTER (WHERE event_id <= $2::uuid), count(*) FROM _ontology_replication_delivery
     WHERE generation = $1::uuid AND (is_baseline OR revision <= $3::bigint)
     GROUP BY history_table ORDER BY history_table`

// ReplayProgress reads, while a replay of t runs, how far its pages went in
// each entity's events (nil when none runs). It reads the generation's
// delivery rows in the replay's scope once, as ReplayRemaining does.
func (s *Store) ReplayProgress(ctx context.Context, t Target) ([]EntityProgress, error) {
	if !t.UsesDelivery() || t.ReplayComplete || t.InitialRevision == nil {
		return nil, nil
	}
	var out []EntityProgress
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlReplayProgress, t.Generation, t.ReplayCursor, *t.InitialRevision)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (EntityProgress, error) {
			var p EntityProgress
			err := r.Scan(&p.HistoryTable, &p.Done, &p.Total)
			return p, err
		})
		if err != nil {
			return err
		}
		entities := map[string]string{} // history table → entity id
		for _, sel := range t.Selection {
			if table, err := s.entityHistoryTable(ctx, tx, sel.EntityID); err == nil {
				entities[table] = sel.EntityID
			}
		}
		for i := range out {
			out[i].EntityID = entities[out[i].HistoryTable]
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: read the replay's progress of %s: %w", t.Generation, err)
	}
	return out, nil
}

// sqlBackfillProgress counts, per history table (NULL: the baselines), the
// delivery rows a backfill of the target has enqueued so far: the
// baselines, and the history in its revision range ($2, $3].
const sqlBackfillProgress = `SELECT coalesce(history_table, ''), count(*) FROM _ontology_replication_delivery
     WHERE generation = $1::uuid AND (is_baseline OR (revision > $2::bigint AND revision <= $3::bigint))
     GROUP BY 1`

// BackfillProgress reads, while a backfill of t runs, how far it went: the
// baselines (an entry with no entity and no history table) and each
// selected entity's history, enqueued of all (nil when none runs). It
// counts the generation's delivery rows and each history table's rows in
// the backfill's range once, as BackfillTotal does.
func (s *Store) BackfillProgress(ctx context.Context, t Target) ([]EntityProgress, error) {
	if !t.UsesDelivery() || t.BackfillComplete || t.BackfillRevision == nil {
		return nil, nil
	}
	var out []EntityProgress
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlBackfillProgress, t.Generation, t.FromRevision, *t.BackfillRevision)
		if err != nil {
			return err
		}
		done := map[string]int64{}
		var table string
		var n int64
		if _, err := pgx.ForEachRow(rows, []any{&table, &n}, func() error { done[table] = n; return nil }); err != nil {
			return err
		}
		baselines := EntityProgress{Done: done[""]}
		if err := tx.QueryRow(ctx, sqlBackfillRemainingBaselines, t.Generation).Scan(&baselines.Total); err != nil {
			return err
		}
		out = append(out, baselines)
		for _, sel := range t.Selection {
			table, err := s.entityHistoryTable(ctx, tx, sel.EntityID)
			if err != nil {
				return err
			}
			ident, err := s.historyTable(ctx, tx, table)
			if err != nil {
				return err
			}
			p := EntityProgress{EntityID: sel.EntityID, HistoryTable: table, Done: done[table]}
			if err := tx.QueryRow(ctx, fmt.Sprintf(sqlBackfillRemainingHistory, ident), t.SourceID, t.FromRevision, *t.BackfillRevision).Scan(&p.Total); err != nil {
				return err
			}
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: read the backfill's progress of %s: %w", t.Generation, err)
	}
	return out, nil
}
