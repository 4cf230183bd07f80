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
	// The seed's page: a read, then the reset, the receipts and the cursor,
	// the ids passed back as a JSON array. Its read's OR on the cursor keeps
	// PostgreSQL from using event_id > $2 as a bound on the primary key
	// (generation, event_id), so each page rescans the generation from its
	// first row.
	sqlReplayPageSeed = `SELECT event_id::text AS id, verified_at IS NOT NULL AS verified FROM _ontology_replication_delivery
       WHERE generation = $1::uuid AND ($2::uuid IS NULL OR event_id > $2::uuid)
         AND (is_baseline OR revision <= $3::bigint)
       ORDER BY event_id LIMIT 1000`
	sqlReplayResetSeed = `UPDATE _ontology_replication_delivery SET accepted_at = NULL, verified_at = NULL, next_verify_at = now()
       WHERE generation = $1::uuid AND event_id IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))`
	sqlReplayReceiptsSeed = `DELETE FROM _ontology_replication_receipts WHERE generation = $1::uuid
       AND event_id IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))`
	sqlReplayCursorSeed = `UPDATE _ontology_replication_targets SET replay_cursor = $2::uuid, replay_complete = $3,
        verified_count = verified_count - $4::bigint WHERE generation = $1::uuid`

	// sqlReplayPage is the same page as one statement, after the target row
	// lock: the page read (the seed's predicates, order and limit), the reset
	// and the receipts joined to it by primary key, and the cursor update,
	// which keeps the cursor when the page is empty and subtracts the rows
	// the read saw verified, as the seed does. It returns the page's row and
	// verified counts. %s bounds the read: sqlReplayFirst or sqlReplayAfter,
	// the seed's cursor OR split in two so that the next pages walk the key
	// from the cursor (same rows, same order). All four parts see one
	// snapshot; a row a concurrent drain acknowledges after it is reset from
	// its newest version, as the seed's separate UPDATE would. The receipts
	// deleted are those of the rows reset, so a receipt goes only once its
	// delivery row is locked: the seed gets the same order (delivery rows,
	// then receipts) from its statement order, and a drain acknowledging a
	// claimed row (delivery row, then receipt) must never find the receipt
	// deleted by a replay that waits for that row. (PostgreSQL runs the parts
	// of a statement in no promised order; deleting by the page instead
	// deadlocked with acknowledgements.)
	//
	// Timed per statement at 10⁶ delivery rows, the seed's four statements
	// cost 5.1 ms (read), 15.5 (reset), 5.1 (receipts) and 0.2 (cursor) a
	// page; of the reset, 5.4 ms went on expanding the JSON id list and
	// finding the 1,000 rows again, which the join to the read saves, with
	// the receipts' list and three round trips.
	//
	// The reset and the receipts find their rows with = ANY (ARRAY(SELECT
	// ...)), an index condition on each primary key. Written as joins to
	// the page (UPDATE ... FROM page), they were hash-joined to a
	// sequential scan of each whole table below about half a million rows:
	// 60 of a page's 75 ms at 100,000 rows, where by key the page takes 16
	// (TestReplayPageUsesPrimaryKey). The array also has the reset lock
	// every row of the page before the first receipt is deleted.
	sqlReplayPage = `WITH page AS (
         SELECT event_id, verified_at IS NOT NULL AS verified FROM _ontology_replication_delivery
          WHERE generation = $1::uuid AND %s
            AND (is_baseline OR revision <= $3::bigint)
          ORDER BY event_id LIMIT 1000
       ), reset AS (
         UPDATE _ontology_replication_delivery SET accepted_at = NULL, verified_at = NULL, next_verify_at = now()
          WHERE generation = $1::uuid AND event_id = ANY (ARRAY(SELECT event_id FROM page))
          RETURNING event_id
       ), receipts AS (
         DELETE FROM _ontology_replication_receipts
          WHERE generation = $1::uuid AND event_id = ANY (ARRAY(SELECT event_id FROM reset))
       ), summary AS (
         SELECT count(*) AS rows, count(*) FILTER (WHERE verified) AS verified,
                (SELECT event_id FROM page ORDER BY event_id DESC LIMIT 1) AS last
           FROM page
       )
       UPDATE _ontology_replication_targets t SET replay_cursor = coalesce(s.last, t.replay_cursor),
              replay_complete = s.rows < 1000, verified_count = t.verified_count - s.verified
         FROM summary s WHERE t.generation = $1::uuid
       RETURNING s.rows, s.verified`
	sqlReplayFirst = `$2::uuid IS NULL`
	sqlReplayAfter = `event_id > $2::uuid`
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
		bound := sqlReplayFirst
		if cursor != nil {
			bound = sqlReplayAfter
		}
		var rows, verified int64
		if err := tx.QueryRow(ctx, fmt.Sprintf(sqlReplayPage, bound), t.Generation, cursor, fence).Scan(&rows, &verified); err != nil {
			return err
		}
		page.Rows, page.Verified = int(rows), int(verified)
		page.Complete = rows < ReplayPageSize
		return nil
	})
	if err != nil {
		return ReplayPage{}, fmt.Errorf("store: advance replay of %s: %w", t.Generation, err)
	}
	if page.Rows > 0 {
		s.targetRowUpdated(ctx)
	}
	return page, nil
}
