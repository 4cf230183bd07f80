package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ReplayPageSize is how many delivery rows one replay page resets.
const ReplayPageSize = 1000

// sqlInitReplay is replayReplicationV4 (seed 000), run after the singleton
// row lock and the exclusive lifecycle lock: constant time, whatever the
// queue holds. It fences the replay at the revision sequence's current
// value; events written later are not part of it.
const sqlInitReplay = `UPDATE _ontology_replication_targets SET replay_complete = false, replay_cursor = NULL,
        initial_revision = (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM _ontology_replication_revision)
       WHERE generation = $1::uuid`

// The statements of advanceReplicationReplay (seed 000), one page per
// transaction: lock the target row, take the next 1,000 rows at or below the
// fence by event_id, make them pending again, drop their receipts, and move
// the cursor, subtracting the verified rows from verified_count.
const (
	sqlReplayTarget = `SELECT replay_complete, replay_cursor::text, initial_revision FROM _ontology_replication_targets
       WHERE generation = $1::uuid FOR NO KEY UPDATE`
	// sqlReplayPageSeed is the seed's page read. Its OR on the cursor keeps
	// PostgreSQL from using event_id > $2 as a bound on the primary key
	// (generation, event_id), so each page rescans the generation from its
	// first row. The store runs the same read split in two, first page and
	// next pages, which walk the key from the cursor: same rows, same order.
	sqlReplayPageSeed = `SELECT event_id::text AS id, verified_at IS NOT NULL AS verified FROM _ontology_replication_delivery
       WHERE generation = $1::uuid AND ($2::uuid IS NULL OR event_id > $2::uuid)
         AND (is_baseline OR revision <= $3::bigint)
       ORDER BY event_id LIMIT 1000`
	sqlReplayFirstPage = `SELECT event_id::text AS id, verified_at IS NOT NULL AS verified FROM _ontology_replication_delivery
       WHERE generation = $1::uuid AND $2::uuid IS NULL
         AND (is_baseline OR revision <= $3::bigint)
       ORDER BY event_id LIMIT 1000`
	sqlReplayNextPage = `SELECT event_id::text AS id, verified_at IS NOT NULL AS verified FROM _ontology_replication_delivery
       WHERE generation = $1::uuid AND event_id > $2::uuid
         AND (is_baseline OR revision <= $3::bigint)
       ORDER BY event_id LIMIT 1000`
	sqlReplayReset = `UPDATE _ontology_replication_delivery SET accepted_at = NULL, verified_at = NULL, next_verify_at = now()
       WHERE generation = $1::uuid AND event_id IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))`
	sqlReplayReceipts = `DELETE FROM _ontology_replication_receipts WHERE generation = $1::uuid
       AND event_id IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))`
	sqlReplayCursor = `UPDATE _ontology_replication_targets SET replay_cursor = $2::uuid, replay_complete = $3,
        verified_count = verified_count - $4::bigint WHERE generation = $1::uuid`
)

// InitReplay starts a replay of a generation. At protocol 4 it is the SDK's
// constant-time initialisation (singleton row, then the exclusive lifecycle
// lock, then the cursor reset and fence); AdvanceReplay then resets the
// queue page by page. On the legacy path it deletes the generation's
// receipts, which makes every event pending again.
func (s *Store) InitReplay(ctx context.Context, t Target) error {
	generation := t.Generation
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if t.DeliveryVersion < ProtocolDelivery {
			_, err := tx.Exec(ctx, sqlLegacyReplay, generation)
			return err
		}
		if _, err := tx.Exec(ctx, sqlLockSingleton); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlLockLifecycle, LifecycleLock); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, sqlInitReplay, generation)
		if err == nil && tag.RowsAffected() == 0 {
			return ErrUnknownGeneration
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("store: initialise replay of %s: %w", generation, err)
	}
	return nil
}

// ReplayPage is what one replay page did.
type ReplayPage struct {
	// Rows is how many delivery rows went back to pending.
	Rows int
	// Verified is how many of them had been verified.
	Verified int
	// Complete reports that the replay reached the end of the queue.
	Complete bool
}

// AdvanceReplay resets the next page of up to 1,000 delivery rows at or
// below the replay's fence (advanceReplicationReplay, seed 000), in its own
// transaction. Rows written after InitReplay are left alone. On the legacy
// path, and when no replay is in progress, it reports Complete at once.
func (s *Store) AdvanceReplay(ctx context.Context, t Target) (ReplayPage, error) {
	if !t.UsesDelivery() {
		return ReplayPage{Complete: true}, nil
	}
	var page ReplayPage
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var complete bool
		var cursor *string
		var fence *int64
		err := tx.QueryRow(ctx, sqlReplayTarget, t.Generation).Scan(&complete, &cursor, &fence)
		if err == pgx.ErrNoRows || (err == nil && complete) {
			page.Complete = true
			return nil
		}
		if err != nil {
			return err
		}
		query := sqlReplayFirstPage
		if cursor != nil {
			query = sqlReplayNextPage
		}
		rows, err := tx.Query(ctx, query, t.Generation, cursor, fence)
		if err != nil {
			return err
		}
		ids := make([]string, 0, ReplayPageSize)
		var id string
		var verified bool
		_, err = pgx.ForEachRow(rows, []any{&id, &verified}, func() error {
			ids = append(ids, id)
			if verified {
				page.Verified++
			}
			return nil
		})
		if err != nil {
			return err
		}
		js := idsJSON(ids)
		if _, err := tx.Exec(ctx, sqlReplayReset, t.Generation, js); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlReplayReceipts, t.Generation, js); err != nil {
			return err
		}
		page.Rows = len(ids)
		page.Complete = len(ids) < ReplayPageSize
		if len(ids) > 0 {
			cursor = &ids[len(ids)-1]
		}
		_, err = tx.Exec(ctx, sqlReplayCursor, t.Generation, cursor, page.Complete, page.Verified)
		return err
	})
	if err != nil {
		return ReplayPage{}, fmt.Errorf("store: advance replay of %s: %w", t.Generation, err)
	}
	return page, nil
}
