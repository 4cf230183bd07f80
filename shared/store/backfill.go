package store

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// BackfillPageSize is how many rows one backfill page enqueues.
const BackfillPageSize = 1000

// The statements of advanceReplicationBackfill (seed 000). A target created
// under protocol 3 has events in its baselines and history tables but no
// delivery rows; backfill walks the baselines and then each selected history
// table in pages of 1,000 by id, inserting delivery rows that carry over the
// receipts' accepted and verified state. Static pre-upgrade histories get no
// new inserts: protocol-4 writers enqueue new history themselves.
const (
	sqlBackfillTarget = `SELECT ` + sqlTargetFieldsV4 + `
       FROM _ontology_replication_targets WHERE generation = $1::uuid FOR NO KEY UPDATE`
	// The page reads select the same rows in the same order as the seed's
	// (seed_test.go), but can walk the primary key from the cursor: the
	// seed's OR on the cursor, ($2::uuid IS NULL OR id > $2::uuid), keeps
	// PostgreSQL from using id > $2 as an index bound, and its ORDER BY sorts
	// the text form of the id, which no index holds, so every page reads and
	// sorts every remaining row. The text and uuid orders are the same
	// (lower-case hex at fixed positions); the first page simply has no lower
	// bound. The plan of the seed's history page at 10⁵ rows, half done:
	//
	//	Limit -> Sort (Sort Key: ((id)::text), top-N heapsort)
	//	  -> Index Scan using _replication_<key>_idx on product_history (actual rows=49999)
	//	       Filter: ((id > '…'::uuid) AND ((replication ->> 'source_id') = '…'))
	//
	// The transaction also turns sorting off (sqlBackfillPlan): PostgreSQL's
	// default selectivity for replication->>'source_id' = $3 makes it still
	// prefer the revision index and a sort; with sorting off the plan is
	// Limit -> Index Scan using product_history_pkey (Index Cond: id > '…'),
	// 1,000 rows read. On large tables PostgreSQL then plans that scan in
	// parallel (Gather Merge), whose start-up dominates a 1,000-row page, so
	// parallel workers are turned off too, and so is JIT compilation, which
	// the disabled sort's cost would otherwise trigger.
	sqlBackfillPlan = `SELECT set_config('enable_sort', 'off', true), set_config('max_parallel_workers_per_gather', '0', true),
           set_config('jit', 'off', true)`
	sqlBackfillBaselineFirstPage = `SELECT b.id, b.event FROM _ontology_replication_baselines b WHERE b.generation = $1::uuid
           AND $2::uuid IS NULL ORDER BY b.id LIMIT 1000`
	sqlBackfillBaselineNextPage = `SELECT b.id, b.event FROM _ontology_replication_baselines b WHERE b.generation = $1::uuid
           AND b.id > $2::uuid ORDER BY b.id LIMIT 1000`
	// %s is the history table's quoted identifier.
	sqlBackfillHistoryFirstPage = `SELECT h.id, h.replication AS event FROM %s h WHERE h.replication IS NOT NULL
           AND h.replication->>'source_id' = $3 AND (h.replication->>'revision')::bigint > $4::bigint
           AND (h.replication->>'revision')::bigint <= $5::bigint
           AND $2::uuid IS NULL AND $1::uuid IS NOT NULL ORDER BY h.id LIMIT 1000`
	sqlBackfillHistoryNextPage = `SELECT h.id, h.replication AS event FROM %s h WHERE h.replication IS NOT NULL
           AND h.replication->>'source_id' = $3 AND (h.replication->>'revision')::bigint > $4::bigint
           AND (h.replication->>'revision')::bigint <= $5::bigint
           AND h.id > $2::uuid AND $1::uuid IS NOT NULL ORDER BY h.id LIMIT 1000`
	// sqlBackfillPage enqueues a page in one statement: the page read (one
	// of the four above) feeds the seed's insert directly, where the seed
	// reads the ids, sends them back as a JSON array and finds each row
	// again by id. It returns the page's row count, its last id (the next
	// cursor: the greatest text form, in the same order as the uuids,
	// without a sort) and how many rows it queued verified. The first %s is
	// the page read; the second, the parameter holding the history table
	// (NULL for baselines), the seed's $3, whose nullness is the seed's $4,
	// is_baseline. The receipts are joined LATERAL, by primary key per row:
	// as a plain join PostgreSQL hashed the whole receipts table for each
	// page.
	//
	// The seed's page runs the insert and the verified_count update as one
	// statement, whose foreign-key checks (each delivery row locks the
	// target row FOR KEY SHARE) run at its end, after the same statement
	// updated the target row, so each of the 1,000 locks lands on a row
	// version the transaction itself updated; and it updates the target row
	// twice a page. Here the target row is updated once, after this
	// statement (sqlBackfillCursor: cursor and verified_count together), so
	// the checks find it merely locked, and fewer versions of it are left
	// for the next pages' checks to step over (see TargetVacuumEvery).
	sqlBackfillPage = `WITH page AS (%s), inserted AS (
        INSERT INTO _ontology_replication_delivery
          (generation, event_id, history_table, revision, is_baseline, accepted_at, verified_at, next_verify_at)
        SELECT $1::uuid, e.id, %[2]s::text, (e.event->>'revision')::bigint, %[2]s::text IS NULL,
          r.accepted_at, r.verified_at, now() FROM page e
        LEFT JOIN LATERAL (SELECT accepted_at, verified_at FROM _ontology_replication_receipts
          WHERE generation = $1::uuid AND event_id = e.id) r ON true
        ON CONFLICT DO NOTHING RETURNING verified_at
      ) SELECT (SELECT count(*) FROM page), (SELECT max(e.id::text) FROM page e),
        (SELECT count(verified_at) FROM inserted)`
	sqlBackfillCursor = `UPDATE _ontology_replication_targets SET backfill_cursor = $2::jsonb, backfill_complete = $3,
       verified_count = verified_count + $4::bigint WHERE generation = $1::uuid`
)

// backfillCursor is the SDK's backfill_cursor: the position in the table
// list (0 = baselines, then the selection's history tables in order) and the
// last id done in that table.
type backfillCursor struct {
	Table int     `json:"table"`
	ID    *string `json:"id,omitempty"`
}

// BackfillPage is what one backfill page did.
type BackfillPage struct {
	// Table is the table the page read: "baselines" or a history table.
	Table string
	// Rows is how many events the page enqueued (or found already queued).
	Rows int
	// Complete reports that the backfill is finished.
	Complete bool
}

// backfillPageStatement is the statement of a backfill page of one table
// ("": the baselines) from the cursor, with its arguments.
func (s *Store) backfillPageStatement(ctx context.Context, tx pgx.Tx, generation string, cur Target, cursor backfillCursor, table string) (string, []any, error) {
	if table == "" {
		read := sqlBackfillBaselineFirstPage
		if cursor.ID != nil {
			read = sqlBackfillBaselineNextPage
		}
		return fmt.Sprintf(sqlBackfillPage, read, "$3"), []any{generation, cursor.ID, nil}, nil
	}
	ident, err := s.historyTable(ctx, tx, table)
	if err != nil {
		return "", nil, err
	}
	read := sqlBackfillHistoryFirstPage
	if cursor.ID != nil {
		read = sqlBackfillHistoryNextPage
	}
	return fmt.Sprintf(sqlBackfillPage, fmt.Sprintf(read, ident), "$6"),
		[]any{generation, cursor.ID, cur.SourceID, cur.FromRevision, cur.BackfillRevision, table}, nil
}

// AdvanceBackfill enqueues the next page of up to 1,000 events of a target
// created under protocol 3 (advanceReplicationBackfill, seed 000), in its
// own transaction under the shared lifecycle lock. Each selected entity's
// history table is the one whose capture trigger runs the entity's capture
// function (CaptureFunction), never a name derived from the manifest. It
// reports Complete at once for a target that needs no backfill.
func (s *Store) AdvanceBackfill(ctx context.Context, t Target) (BackfillPage, error) {
	if !t.DatabaseAtDelivery() {
		return BackfillPage{}, fmt.Errorf("store: backfill of %s: %w: backfill needs protocol 4 and the database is at %d", t.Generation, ErrUnsupportedProtocol, t.DeliveryVersion)
	}
	var page BackfillPage
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlShareLifecycle, LifecycleLock); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlBackfillPlan); err != nil {
			return err
		}
		cur, err := scanTarget(tx.QueryRow(ctx, sqlBackfillTarget, t.Generation))
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrUnknownGeneration
		}
		if err != nil {
			return err
		}
		if cur.BackfillComplete {
			page.Complete = true
			return nil
		}
		rawCursor := cur.BackfillCursor
		var cursor backfillCursor
		if err := json.Unmarshal(rawCursor, &cursor); err != nil {
			return fmt.Errorf("backfill_cursor %s: %w", rawCursor, err)
		}
		// tables[0] is the baselines (""), then one history table per selected entity.
		tables := []string{""}
		for _, sel := range cur.Selection {
			table, err := s.entityHistoryTable(ctx, tx, sel.EntityID)
			if err != nil {
				return err
			}
			tables = append(tables, table)
		}
		if cursor.Table >= len(tables) {
			// The selection is immutable per generation; a cursor past its end
			// means the last table was finished.
			page.Complete = true
			_, err := tx.Exec(ctx, sqlBackfillCursor, t.Generation, string(rawCursor), true, 0)
			return err
		}
		table := tables[cursor.Table]
		page.Table = cmp.Or(table, "baselines")
		statement, args, err := s.backfillPageStatement(ctx, tx, t.Generation, cur, cursor, table)
		if err != nil {
			return err
		}
		var rows, verified int64
		var last *string
		if err := tx.QueryRow(ctx, statement, args...).Scan(&rows, &last, &verified); err != nil {
			return err
		}

		page.Rows = int(rows)
		finishedTable := rows < BackfillPageSize
		page.Complete = finishedTable && cursor.Table+1 >= len(tables)
		next := backfillCursor{Table: cursor.Table}
		if finishedTable {
			next = backfillCursor{Table: cursor.Table + 1}
		} else {
			next.ID = last
		}
		raw, _ := json.Marshal(next)
		_, err = tx.Exec(ctx, sqlBackfillCursor, t.Generation, string(raw), page.Complete, verified)
		return err
	})
	if err != nil {
		return BackfillPage{}, fmt.Errorf("store: advance backfill of %s: %w", t.Generation, err)
	}
	if page.Rows > 0 {
		s.targetRowUpdated(ctx)
	}
	return page, nil
}
