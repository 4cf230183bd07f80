package sdkfixture

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// BulkCreate creates n records of an entity with set-based statements, in
// SDK write transactions of up to chunk records: one business-row insert and
// one history insert per transaction, so the capture trigger still records
// one event per record. It is for benchmarks and large local workloads,
// where committing record by record would take too long. stringField, when
// not empty, is set to "bulk <n>".
func BulkCreate(ctx context.Context, db DB, m Manifest, entity, stringField string, n, chunk int) error {
	e, ok := m.Entity(entity)
	if !ok {
		return fmt.Errorf("sdkfixture: unknown entity %q", entity)
	}
	chunk = max(chunk, 1)
	for done := 0; done < n; done += chunk {
		k := min(chunk, n-done)
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if err := beginReplicationWrite(ctx, tx); err != nil {
				return err
			}
			insert := `INSERT INTO ` + qi(tableName(e.Name)) + ` (created_at) SELECT clock_timestamp() FROM generate_series(1, $1) RETURNING id`
			if stringField != "" {
				insert = `INSERT INTO ` + qi(tableName(e.Name)) + ` (` + qi(stringField) + `) SELECT 'bulk ' || g FROM generate_series(1, $1) g RETURNING id`
			}
			rows, err := tx.Query(ctx, insert, k)
			if err != nil {
				return fmt.Errorf("sdkfixture: bulk insert %s: %w", e.Name, err)
			}
			ids, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO `+qi(historyTable(e.Name))+` ("record_id", "kind", "changes")
				SELECT id, 'create', '{}'::jsonb FROM unnest($1::uuid[]) AS id`, ids)
			if err != nil {
				return fmt.Errorf("sdkfixture: bulk history %s: %w", e.Name, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// PadPayloads adds a note of n bytes to the payload of every captured
// product event, then vacuums and analyses (benchmarks of 1 KB events).
func PadPayloads(ctx context.Context, db interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}, n int) error {
	if _, err := db.Exec(ctx, `UPDATE product_history SET replication = jsonb_set(replication, '{payload}',
		to_jsonb(((replication->>'payload')::jsonb || jsonb_build_object('note', repeat('x', $1::int)))::text))`, n); err != nil {
		return fmt.Errorf("sdkfixture: pad payloads: %w", err)
	}
	if _, err := db.Exec(ctx, "VACUUM ANALYZE"); err != nil {
		return fmt.Errorf("sdkfixture: vacuum: %w", err)
	}
	return nil
}

// FloorDrain is the least SQL that can drain a batch of the demo's
// products: one statement per 100 events that claims them, reads their
// events, accepts them and writes their receipts (no publish between the
// read and the acceptance, no byte bound). $1 is the generation.
// Benchmarks judge the drain's PostgreSQL cost against it.
const FloorDrain = `WITH batch AS (
    SELECT event_id FROM _ontology_replication_delivery WHERE generation = $1::uuid AND accepted_at IS NULL
     ORDER BY revision, event_id LIMIT 100 FOR UPDATE SKIP LOCKED
  ), events AS (
    SELECT h.id, h.replication FROM product_history h WHERE h.id = ANY (ARRAY(SELECT event_id FROM batch))
  ), accepted AS (
    UPDATE _ontology_replication_delivery SET accepted_at = now(), next_verify_at = now()
     WHERE generation = $1::uuid AND event_id = ANY (ARRAY(SELECT event_id FROM batch)) RETURNING event_id, accepted_at
  ), receipts AS (
    INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at) SELECT $1::uuid, event_id, accepted_at FROM accepted
  ) SELECT id::text, replication FROM events`

// FloorClaim, FloorLifecycleLock and FloorAccept are the least SQL that can
// drain a batch of the demo's products with a publish between reading and
// accepting: one transaction that claims the next 100 pending events (FOR
// UPDATE SKIP LOCKED, released at its commit) and reads them, and one,
// after the publish, that takes the shared lifecycle lock and accepts them
// with the seed's acknowledgement (the events' history ids in $2, a
// uuid[]), receipts ON CONFLICT DO NOTHING. Nothing keeps two such drains
// from publishing the same event, and nothing is held while the batch is
// published. Benchmarks judge the drain's PostgreSQL cost against it beside
// FloorDrain (see DrainWithFloor). $1 is the generation.
const (
	// FloorClaim claims and reads the next batch.
	FloorClaim = `WITH batch AS (
    SELECT event_id FROM _ontology_replication_delivery WHERE generation = $1::uuid AND accepted_at IS NULL
     ORDER BY revision, event_id LIMIT 100 FOR UPDATE SKIP LOCKED
  ) SELECT h.id::text, h.replication FROM product_history h WHERE h.id = ANY (ARRAY(SELECT event_id FROM batch))`
	// FloorLifecycleLock is the shared lifecycle lock, first in the
	// acceptance's transaction.
	FloorLifecycleLock = `SELECT pg_advisory_xact_lock_shared(hashtextextended('segmentstream.ontology.replication.lifecycle', 0))`
	// FloorAccept accepts the published batch.
	FloorAccept = `WITH accepted AS (
    UPDATE _ontology_replication_delivery SET accepted_at = now(), next_verify_at = now()
     WHERE generation = $1::uuid AND accepted_at IS NULL AND event_id = ANY (ARRAY(SELECT unnest($2::uuid[])))
     RETURNING event_id, accepted_at
  ) INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at)
    SELECT $1::uuid, event_id, accepted_at FROM accepted ON CONFLICT DO NOTHING`
)

// DrainWithFloor drains the generation's pending product events on conn
// with a floor until none is left, and returns how many it took. With a nil
// publish it runs FloorDrain; otherwise FloorClaim, then publish with the
// batch's history ids and raw events, then FloorLifecycleLock and
// FloorAccept in one transaction. The slices passed to publish are reused
// by the next batch.
func DrainWithFloor(ctx context.Context, conn *pgx.Conn, generation string, publish func(ids []string, events [][]byte) error) (int64, error) {
	query := FloorDrain
	if publish != nil {
		query = FloorClaim
	}
	var taken int64
	var ids []string
	var events [][]byte
	for {
		rows, err := conn.Query(ctx, query, generation)
		if err != nil {
			return taken, fmt.Errorf("sdkfixture: floor read: %w", err)
		}
		ids, events = ids[:0], events[:0]
		var id string
		var raw []byte
		if _, err := pgx.ForEachRow(rows, []any{&id, &raw}, func() error {
			ids, events = append(ids, id), append(events, raw)
			return nil
		}); err != nil {
			return taken, fmt.Errorf("sdkfixture: floor read: %w", err)
		}
		if len(ids) == 0 {
			return taken, nil
		}
		if publish != nil {
			if err := publish(ids, events); err != nil {
				return taken, err
			}
			b := &pgx.Batch{}
			b.Queue(FloorLifecycleLock)
			b.Queue(FloorAccept, generation, ids)
			if err := conn.SendBatch(ctx, b).Close(); err != nil {
				return taken, fmt.Errorf("sdkfixture: floor accept: %w", err)
			}
		}
		taken += int64(len(ids))
	}
}

// FloorReplayPage is the least SQL that can reset a page of a replay: one
// statement that sends the next 1,000 rows by event_id after $2 (NULL:
// from the start) back to pending, drops their receipts and returns the
// page's last id and size. $1 is the generation.
const FloorReplayPage = `WITH page AS (
    SELECT event_id FROM _ontology_replication_delivery WHERE generation = $1::uuid AND ($2::uuid IS NULL OR event_id > $2::uuid)
     ORDER BY event_id LIMIT 1000
  ), reset AS (
    UPDATE _ontology_replication_delivery SET accepted_at = NULL, verified_at = NULL, next_verify_at = now()
     WHERE generation = $1::uuid AND event_id = ANY (ARRAY(SELECT event_id FROM page)) RETURNING event_id
  ), receipts AS (
    DELETE FROM _ontology_replication_receipts WHERE generation = $1::uuid AND event_id = ANY (ARRAY(SELECT event_id FROM reset))
  ) SELECT (SELECT max(event_id::text) FROM page), (SELECT count(*) FROM page)`
