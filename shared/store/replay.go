package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
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

	// sqlReplayPage is the seed's page read, reset and cursor update as one
	// statement, after the target row lock: the page read (the seed's
	// predicates, order and limit) feeds the reset, found by primary key,
	// and the cursor update, which keeps the cursor when the page is empty
	// and subtracts the rows the read saw verified, as the seed does. It
	// returns the page's row and verified counts and the ids it reset. %s
	// bounds the read: sqlReplayFirst or sqlReplayAfter, the seed's cursor
	// OR ($2::uuid IS NULL OR event_id > $2::uuid) split in two so that the
	// next pages walk the primary key from the cursor (same rows, same
	// order), where the seed's OR rescans the generation from its first row
	// on every page. A row a concurrent acknowledgement updates is reset
	// from its newest version once that transaction ends, as the seed's
	// separate UPDATE would.
	//
	// The reset finds its rows with = ANY (ARRAY(SELECT …)), an index
	// condition on the primary key: written as a join to the page (UPDATE
	// … FROM page), PostgreSQL hash-joined it to a sequential scan of the
	// whole table below about half a million rows
	// (TestReplayPageUsesPrimaryKey).
	sqlReplayPage = `WITH page AS (
         SELECT event_id, verified_at IS NOT NULL AS verified FROM _ontology_replication_delivery
          WHERE generation = $1::uuid AND %s
            AND (is_baseline OR revision <= $3::bigint)
          ORDER BY event_id LIMIT 1000
       ), reset AS (
         UPDATE _ontology_replication_delivery SET accepted_at = NULL, verified_at = NULL, next_verify_at = now()
          WHERE generation = $1::uuid AND event_id = ANY (ARRAY(SELECT event_id FROM page))
          RETURNING event_id
       ), summary AS (
         SELECT count(*) AS rows, count(*) FILTER (WHERE verified) AS verified,
                (SELECT event_id FROM page ORDER BY event_id DESC LIMIT 1) AS last
           FROM page
       )
       UPDATE _ontology_replication_targets t SET replay_cursor = coalesce(s.last, t.replay_cursor),
              replay_complete = s.rows < 1000, verified_count = t.verified_count - s.verified
         FROM summary s WHERE t.generation = $1::uuid
       RETURNING s.rows, s.verified, (SELECT coalesce(array_agg(event_id), '{}') FROM reset)`
	sqlReplayFirst = `$2::uuid IS NULL`
	sqlReplayAfter = `event_id > $2::uuid`

	// sqlReplayReceipts deletes the receipts of the rows the page reset, as
	// the seed's page does, in a statement of its own after the reset: its
	// snapshot is taken once the reset holds every row of the page, so it
	// also sees the receipt of an acknowledgement that committed while the
	// reset waited for that row (one statement's snapshot would miss it and
	// leave a receipt on a pending row). The order of the seed's page stays:
	// delivery rows, then receipts, as an acknowledgement takes them, so the
	// two cannot deadlock.
	sqlReplayReceipts = `DELETE FROM _ontology_replication_receipts
       WHERE generation = $1::uuid AND event_id = ANY (ARRAY(SELECT unnest($2::uuid[])))`
)

// InitReplay starts a replay of a generation. At protocol 4 it is the SDK's
// constant-time initialisation (singleton row, then the exclusive lifecycle
// lock, then the cursor reset and fence); AdvanceReplay then resets the
// queue page by page. On the legacy path it deletes the generation's
// receipts, which makes every event pending again.
func (s *Store) InitReplay(ctx context.Context, t Target) error {
	generation := t.Generation
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if !t.DatabaseAtDelivery() {
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
	err := s.inKeyOrderTx(ctx, func(tx pgx.Tx) error {
		var complete bool
		var cursor *string
		var fence *int64
		err := tx.QueryRow(ctx, sqlReplayTarget, t.Generation).Scan(&complete, &cursor, &fence)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && complete) {
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
		var reset []pgtype.UUID
		if err := tx.QueryRow(ctx, fmt.Sprintf(sqlReplayPage, bound), t.Generation, cursor, fence).Scan(&rows, &verified, &reset); err != nil {
			return err
		}
		if len(reset) > 0 {
			if _, err := tx.Exec(ctx, sqlReplayReceipts, t.Generation, reset); err != nil {
				return err
			}
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

// sqlReplayUndrained reports whether events at or below a replay's fence
// are still waiting to be published (pending and not set aside): a replay
// whose pages are done but whose drain did not finish. It reads the pending
// index, stopping at the first such row.
var sqlReplayUndrained = `SELECT EXISTS (SELECT 1 FROM _ontology_replication_delivery
       WHERE generation = $1::uuid AND accepted_at IS NULL AND (is_baseline OR revision <= $2::bigint) AND ` + sqlClaimable + `)`

// ReplayUndrained reports whether a replay's pages are done but some of its
// events (at or below its fence) still wait to be published.
func (s *Store) ReplayUndrained(ctx context.Context, t Target) (bool, error) {
	if !t.UsesDelivery() || !t.ReplayComplete || t.InitialRevision == nil {
		return false, nil
	}
	var undrained bool
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, sqlReplayUndrained, t.Generation, *t.InitialRevision, s.backoffs).Scan(&undrained)
	})
	if err != nil {
		return false, fmt.Errorf("store: check the replay of %s: %w", t.Generation, err)
	}
	return undrained, nil
}
