package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// A partial replay (`job replay --entity/--since-revision/--records`)
// sends a subset of a generation's events back to pending: the events of
// one entity at a time, walked by history id in pages, each page its own
// transaction. It is the store's own operation (the seeds replay a whole
// generation only); each page is the seed's replay page
// (advanceReplicationReplay, seed 000; sqlReplayPage) with a narrower read:
// the selected events instead of the next rows by event_id. Like that page
// it locks the target row and then the delivery rows in key order, resets
// accepted_at, verified_at and next_verify_at, drops the receipts, and
// subtracts the rows it saw verified from verified_count. Unlike it, a page
// reads its selection first, without the target row lock, and takes that
// lock only when it has rows to reset (the bound is checked again on each
// row then); it writes the target row only when verified_count changes.
//
// Which events: the entity's events as replicationEventsSql has them (sqlEntityEvents:
// its baselines and its history table's captured rows of the target's
// source after from_revision), of revision SinceRevision or later, of the
// chosen record keys when there are any, that were accepted before
// AcceptedBefore. That last bound makes the operation resumable and
// idempotent: an event this replay already sent back is pending, or was
// accepted again after the bound, and a second run with the same bound
// leaves it alone; events captured after the replay began were accepted
// after it too.

// sqlEntityEvents is one entity's part of replicationEventsSql (seed 001)
// with each event's record, revision and deleted flag: its baseline events
// (the baselines of every entity share one table, so they are filtered by
// entity) and the captured rows of its history table (%s, the quoted
// identifier, checked against the capture-trigger tables) of the target's
// source after its from_revision, as sqlLegacyHistoryEvents. $1 generation,
// $2 source, $3 from_revision, $4 entity id.
const sqlEntityEvents = `SELECT event->>'record_kind' AS kind, event->>'record_key' AS key,
         (event->>'revision')::bigint AS revision, (event->>'deleted')::boolean AS deleted, id
    FROM _ontology_replication_baselines WHERE generation = $1::uuid AND event->>'entity_id' = $4
  UNION ALL
  SELECT replication->>'record_kind', replication->>'record_key',
         (replication->>'revision')::bigint, (replication->>'deleted')::boolean, id
    FROM %s WHERE replication IS NOT NULL AND replication->>'source_id' = $2
     AND (replication->>'revision')::bigint > $3::bigint`

// entityEvents builds sqlEntityEvents for an entity of t.
func (s *Store) entityEvents(ctx context.Context, tx pgx.Tx, t Target, entityID string) (string, error) {
	selected := false
	for _, sel := range t.Selection {
		selected = selected || sel.EntityID == entityID
	}
	if !selected {
		return "", fmt.Errorf("entity %q is not selected by target %s", entityID, t.Generation)
	}
	table, err := s.entityHistoryTable(ctx, tx, entityID)
	if err != nil {
		return "", err
	}
	ident, err := s.historyTable(ctx, tx, table)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf(sqlEntityEvents, ident), nil
}

// PartialScanRows is how many of an entity's events one partial-replay page
// reads (its statement's bound, whatever the selection keeps of them).
const PartialScanRows = 5000

// PartialSelection chooses the events of an entity a partial replay sends
// back to pending.
type PartialSelection struct {
	// SinceRevision keeps the events of this revision or later (0: all).
	SinceRevision int64
	// Keys keeps the events of these record keys (nil: every record).
	Keys []string
	// AcceptedBefore keeps the events accepted before this time (the
	// database's clock); it must be set.
	AcceptedBefore time.Time
}

// PartialPage is what one partial-replay page did.
type PartialPage struct {
	// Scanned is how many of the entity's events the page read, and Next
	// the history id to continue after ("" when the entity is done).
	Scanned int
	Next    string
	// Selected is how many of them the selection kept; Rows how many went
	// back to pending (the others were pending already, or accepted after
	// the bound); Verified how many of those had been verified.
	Selected, Rows, Verified int
	// Keys are the selection's keys the page selected events of (nil
	// when the selection has no keys).
	Keys []string
}

// sqlPartialScan reads the next PartialScanRows events of an entity by
// history id ($5 the last id of the previous page, NULL for the first; $9
// PartialScanRows) and keeps the selected ones: revision at least $6, key among $7 (NULL: any);
// with keys, it also returns those of them it selected events of.
// %[1]s is sqlEntityEvents; $1 generation, $2 source, $3 from_revision, $4
// entity id. It is the head of sqlPartialPage and sqlPartialPageLegacy.
const sqlPartialScan = `WITH scanned AS (
         SELECT id, key, revision FROM (%[1]s) e
          WHERE ($5::uuid IS NULL OR id > $5::uuid)
          ORDER BY id LIMIT $9::int
       ), selected AS (
         SELECT id, key FROM scanned WHERE revision >= $6::bigint AND ($7::text[] IS NULL OR key = ANY ($7::text[]))
       ), scan AS (
         SELECT (SELECT count(*) FROM scanned) AS scanned, (SELECT id FROM scanned ORDER BY id DESC LIMIT 1)::text AS last,
                (SELECT count(*) FROM selected) AS selected,
                CASE WHEN $7::text[] IS NOT NULL THEN (SELECT coalesce(array_agg(DISTINCT key), '{}') FROM selected) END AS keys
       )`

// sqlPartialSelect is the protocol-4 page's read: the scan's figures and
// the selected events' delivery rows of the generation that were accepted
// before $8, found by primary key. It takes no lock beyond the share lock
// any read takes: a scan of up to PartialScanRows events takes as long as
// it takes without holding the target row, which the verifier and
// acknowledgements of replayed rows wait on.
const sqlPartialSelect = sqlPartialScan + `, page AS (
         SELECT event_id FROM _ontology_replication_delivery
          WHERE generation = $1::uuid AND event_id = ANY (ARRAY(SELECT id FROM selected)) AND accepted_at < $8::timestamptz
       )
       SELECT scan.scanned, scan.last, scan.selected, scan.keys, coalesce((SELECT array_agg(event_id ORDER BY event_id) FROM page), '{}') FROM scan`

// sqlPartialReset is the protocol-4 page's write, after the target row lock
// (sqlLockTarget), in the page's transaction: the replay page's reset
// (sqlReplayPage) over the rows the read selected ($2), the bound ($3)
// checked again on each row's newest version, and verified_count less the
// rows it saw verified, written only when that changes it (a page that
// resets no verified row leaves the target row alone). It returns how many
// of the reset rows had been verified, whether the target row was written,
// and the ids it reset (whose receipts sqlReplayReceipts then drops).
const sqlPartialReset = `WITH page AS (
         SELECT event_id, verified_at IS NOT NULL AS verified FROM _ontology_replication_delivery
          WHERE generation = $1::uuid AND event_id = ANY (ARRAY(SELECT unnest($2::uuid[]))) AND accepted_at < $3::timestamptz
       ), reset AS (
         UPDATE _ontology_replication_delivery SET accepted_at = NULL, verified_at = NULL, next_verify_at = now()
          WHERE generation = $1::uuid AND event_id = ANY (ARRAY(SELECT event_id FROM page)) AND accepted_at < $3::timestamptz
          RETURNING event_id
       ), summary AS (
         SELECT count(*) FILTER (WHERE verified) AS verified FROM page
       ), target AS (
         UPDATE _ontology_replication_targets t SET verified_count = t.verified_count - s.verified
           FROM summary s WHERE t.generation = $1::uuid AND s.verified > 0
         RETURNING 1
       )
       SELECT (SELECT verified FROM summary), EXISTS (SELECT FROM target), (SELECT coalesce(array_agg(event_id), '{}') FROM reset)`

// sqlPartialPageLegacy is the protocol-3 page: the legacy replay's DELETE
// of receipts (replayReplication, seed 001) over the selected events
// accepted before $8. An event without a receipt is pending.
const sqlPartialPageLegacy = sqlPartialScan + `, reset AS (
         DELETE FROM _ontology_replication_receipts
          WHERE generation = $1::uuid AND event_id = ANY (ARRAY(SELECT id FROM selected)) AND accepted_at < $8::timestamptz
          RETURNING verified_at IS NOT NULL AS verified
       )
       SELECT scan.scanned, scan.last, scan.selected, scan.keys, (SELECT count(*) FROM reset), (SELECT count(*) FILTER (WHERE verified) FROM reset)
         FROM scan`

// ReplayPartialPage sends the next page of an entity's selected events
// back to pending in generation t only, in one transaction, continuing
// after the history id after ("" for the first page). The entity is done
// when the page's Next is "".
func (s *Store) ReplayPartialPage(ctx context.Context, t Target, entityID string, sel PartialSelection, after string) (PartialPage, error) {
	if sel.AcceptedBefore.IsZero() {
		return PartialPage{}, fmt.Errorf("store: partial replay of entity %s: no accepted-before bound", entityID)
	}
	var cursor *string
	if after != "" {
		if _, err := uuids([]string{after}); err != nil {
			return PartialPage{}, fmt.Errorf("store: partial replay of entity %s: %w", entityID, err)
		}
		cursor = &after
	}
	var page PartialPage
	var wroteTarget bool
	run := func(tx pgx.Tx) error {
		events, err := s.entityEvents(ctx, tx, t, entityID)
		if err != nil {
			return err
		}
		args := []any{t.Generation, t.SourceID, t.FromRevision, entityID, cursor, sel.SinceRevision, sel.Keys, sel.AcceptedBefore, PartialScanRows}
		var scanned, selected, rows, verified int64
		var last *string
		var keys []string
		wroteTarget = false
		if !t.DatabaseAtDelivery() {
			err := tx.QueryRow(ctx, fmt.Sprintf(sqlPartialPageLegacy, events), args...).Scan(&scanned, &last, &selected, &keys, &rows, &verified)
			if err != nil {
				return err
			}
		} else {
			scan := []any{&scanned, &last, &selected, &keys}
			if rows, verified, wroteTarget, err = s.resetPartial(ctx, tx, t, fmt.Sprintf(sqlPartialSelect, events), args, scan); err != nil {
				return err
			}
		}
		page = PartialPage{Scanned: int(scanned), Selected: int(selected), Rows: int(rows), Verified: int(verified), Keys: keys}
		if scanned == PartialScanRows && last != nil {
			page.Next = *last
		}
		return nil
	}
	var err error
	if t.DatabaseAtDelivery() {
		err = s.inKeyOrderTx(ctx, run)
	} else {
		err = s.inTx(ctx, run)
	}
	if err != nil {
		return PartialPage{}, fmt.Errorf("store: partial replay of entity %s in %s: %w", entityID, t.Generation, err)
	}
	if wroteTarget { // the vacuum cadence counts the target row's versions
		s.targetRowUpdated(ctx)
	}
	return page, nil
}

// resetPartial runs a protocol-4 page in tx: the read (sqlPartialSelect
// with args, no target lock), whose scan figures go to scan, then, when it
// selected rows to reset, the target row lock and the reset
// (sqlPartialReset). It returns the rows reset, how many of them had been
// verified, and whether the target row was written.
func (s *Store) resetPartial(ctx context.Context, tx pgx.Tx, t Target, read string, args, scan []any) (rows, verified int64, wroteTarget bool, err error) {
	var chosen []pgtype.UUID
	if err := tx.QueryRow(ctx, read, args...).Scan(append(scan, &chosen)...); err != nil {
		return 0, 0, false, err
	}
	if len(chosen) == 0 {
		return 0, 0, false, nil
	}
	tag, err := tx.Exec(ctx, sqlLockTarget, t.Generation)
	if err != nil {
		return 0, 0, false, err
	}
	if tag.RowsAffected() == 0 {
		return 0, 0, false, fmt.Errorf("%w: %s", ErrUnknownGeneration, t.Generation)
	}
	acceptedBefore := args[7]
	var reset []pgtype.UUID
	if err := tx.QueryRow(ctx, sqlPartialReset, t.Generation, chosen, acceptedBefore).Scan(&verified, &wroteTarget, &reset); err != nil {
		return 0, 0, false, err
	}
	if len(reset) > 0 {
		if _, err := tx.Exec(ctx, sqlReplayReceipts, t.Generation, reset); err != nil {
			return 0, 0, false, err
		}
	}
	return int64(len(reset)), verified, wroteTarget, nil
}
