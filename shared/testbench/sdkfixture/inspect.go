package sdkfixture

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/store"
)

// Querier runs a query: a connection, a pool or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// HistoryID returns the id of the history row a change wrote (kind create,
// update or delete) for a record: the event's history id.
func HistoryID(ctx context.Context, db Querier, m Manifest, entity, recordID, kind string) (string, error) {
	if _, ok := m.Entity(entity); !ok {
		return "", fmt.Errorf("sdkfixture: unknown entity %q", entity)
	}
	var id string
	err := db.QueryRow(ctx, `SELECT id::text FROM `+qi(historyTable(entity))+` WHERE record_id = $1::uuid AND kind = $2 ORDER BY at DESC LIMIT 1`,
		recordID, kind).Scan(&id)
	if err != nil {
		return "", fmt.Errorf("sdkfixture: history of %s %s: %w", entity, recordID, err)
	}
	return id, nil
}

// Records returns the ids of an entity's records, or for a many-relationship
// the "<source>:<target>" keys of its edges: what the latest-state views
// must show.
func Records(ctx context.Context, db Querier, m Manifest, entity, relationship string) (map[string]bool, error) {
	e, ok := m.Entity(entity)
	if !ok {
		return nil, fmt.Errorf("sdkfixture: unknown entity %q", entity)
	}
	query := `SELECT id::text FROM ` + qi(tableName(e.Name))
	if relationship != "" {
		var rel *Relationship
		for i, r := range e.Relationships {
			if r.Name == relationship && r.Cardinality == "many" {
				rel = &e.Relationships[i]
			}
		}
		if rel == nil {
			return nil, fmt.Errorf("sdkfixture: %s has no many-relationship %q", entity, relationship)
		}
		src, dst := joinColumns(e.Name, *rel)
		query = `SELECT ` + qi(src) + `::text || ':' || ` + qi(dst) + `::text FROM ` + qi(joinTable(e.Name, rel.Name))
	}
	rows, err := db.Query(ctx, query)
	if err != nil {
		return nil, err
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(keys))
	for _, k := range keys {
		out[k] = true
	}
	return out, nil
}

// AgeAcceptance moves an accepted event's times (acceptance, last and next
// check) back by d, standing in for the passage of time: the local mode uses it so that the verifier's
// 15-minute retry of an event that never landed happens within a demo.
func AgeAcceptance(ctx context.Context, db Querier, generation, historyID string, d time.Duration) (bool, error) {
	tag, err := db.Exec(ctx, `UPDATE _ontology_replication_delivery SET accepted_at = accepted_at - make_interval(secs => $3),
		next_verify_at = next_verify_at - make_interval(secs => $3), last_checked_at = last_checked_at - make_interval(secs => $3)
		WHERE generation = $1::uuid AND event_id = $2::uuid AND accepted_at IS NOT NULL AND verified_at IS NULL`,
		generation, historyID, d.Seconds())
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// RecordValues returns an entity's records as its latest-state view must
// show them: each record's id and the given columns (the view's: id, the
// timestamps, properties and one-relationship ids) as a JSON array in
// PostgreSQL's jsonb text, ids as text, other values in their own types.
func RecordValues(ctx context.Context, db Querier, m Manifest, entity string, columns []string) (map[string]string, error) {
	e, ok := m.Entity(entity)
	if !ok {
		return nil, fmt.Errorf("sdkfixture: unknown entity %q", entity)
	}
	var values []string
	for _, c := range columns {
		i := slices.IndexFunc(e.Fields(), func(f Field) bool { return f.Name == c })
		if i < 0 {
			return nil, fmt.Errorf("sdkfixture: %s has no field %q", entity, c)
		}
		f := e.Fields()[i]
		v := qi(f.Column)
		if c == "id" || strings.HasSuffix(c, "_id") && f.Storage == "string" {
			v += "::text"
		}
		values = append(values, v)
	}
	rows, err := db.Query(ctx, `SELECT id::text, jsonb_build_array(`+strings.Join(values, ", ")+`)::text FROM `+qi(tableName(entity)))
	if err != nil {
		return nil, fmt.Errorf("sdkfixture: records of %s: %w", entity, err)
	}
	out := map[string]string{}
	var id, row string
	_, err = pgx.ForEachRow(rows, []any{&id, &row}, func() error {
		out[id] = row
		return nil
	})
	return out, err
}

// DeliveryRow is one event's delivery row, as the chaos proofs read it.
type DeliveryRow struct {
	// HistoryID is the row's event_id column: the history (or baseline)
	// row's id; EventID is the event id its message carries (event.ID).
	HistoryID, EventID string
	// HistoryTable is empty for a baseline.
	HistoryTable       string
	Accepted, Verified bool
	// SetAside: pending and set aside (skipped by claims until a backoff
	// has passed).
	SetAside bool
}

// DeliveryRows reads every delivery row of g's generation.
func DeliveryRows(ctx context.Context, db Querier, g Generation) ([]DeliveryRow, error) {
	rows, err := db.Query(ctx, `SELECT event_id::text, coalesce(history_table, ''), accepted_at IS NOT NULL, verified_at IS NOT NULL,
		accepted_at IS NULL AND last_checked_at IS NOT NULL AND next_verify_at > now()
		FROM _ontology_replication_delivery WHERE generation = $1::uuid`, g.Generation)
	if err != nil {
		return nil, fmt.Errorf("sdkfixture: delivery rows: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeliveryRow, error) {
		var d DeliveryRow
		err := r.Scan(&d.HistoryID, &d.HistoryTable, &d.Accepted, &d.Verified, &d.SetAside)
		d.EventID = event.ID(g.SourceID, d.HistoryID, g.Generation)
		return d, err
	})
}

// ReceiptMismatches counts, in one snapshot, the receipts that disagree
// with their delivery rows at protocol 4: every seed statement that writes
// one writes the other in the same transaction (the acknowledgement
// inserts the receipt of the row it accepts; a replay page, a partial
// replay's and the verifier's retry delete the receipts of the rows they
// make pending; a verification marks both), so a receipt of a pending row,
// or a verified receipt of an unverified row, is a statement that skipped
// its half. It returns an example event id with the count.
func ReceiptMismatches(ctx context.Context, db Querier, generation string) (n int, example string, err error) {
	err = db.QueryRow(ctx, `SELECT count(*), coalesce(min(d.event_id::text), '') FROM _ontology_replication_delivery d
		JOIN _ontology_replication_receipts r ON r.generation = d.generation AND r.event_id = d.event_id
		WHERE d.generation = $1::uuid AND (d.accepted_at IS NULL OR (r.verified_at IS NOT NULL AND d.verified_at IS NULL))`, generation).Scan(&n, &example)
	if err != nil {
		return 0, "", fmt.Errorf("sdkfixture: receipts against delivery rows: %w", err)
	}
	return n, example, nil
}

// sqlUncarried reads which of the given events ($2, history ids) of the
// generation ($1) are pending, not set aside (past a backoff) and not held
// by any claim's lock ($3: store.ClaimLockClass).
const sqlUncarried = `SELECT d.event_id::text FROM _ontology_replication_delivery d
 WHERE d.generation = $1::uuid AND d.event_id = ANY ($2::uuid[]) AND d.accepted_at IS NULL
   AND NOT (d.last_checked_at IS NOT NULL AND d.next_verify_at > now())
   AND NOT EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
         AND l.classid::int = hashtext($3) AND l.objid::int = hashtext(d.event_id::text)
         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))`

// Uncarried returns which of the events (history ids) of a generation are
// pending with nothing carrying them: no drain's claim holds them, and they
// are not set aside.
func Uncarried(ctx context.Context, db Querier, generation string, historyIDs []string) (map[string]bool, error) {
	rows, err := db.Query(ctx, sqlUncarried, generation, historyIDs, store.ClaimLockClass)
	if err != nil {
		return nil, fmt.Errorf("sdkfixture: uncarried events: %w", err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("sdkfixture: uncarried events: %w", err)
	}
	out := make(map[string]bool, len(found))
	for _, id := range found {
		out[id] = true
	}
	return out, nil
}

// CommitTimes returns when each history row of m's entities was written
// (its "at"), by id: the commit time of the event it captured.
func CommitTimes(ctx context.Context, db Querier, m Manifest) (map[string]time.Time, error) {
	out := map[string]time.Time{}
	for _, e := range m.Entities {
		rows, err := db.Query(ctx, `SELECT id::text, at FROM `+qi(historyTable(e.Name)))
		if err != nil {
			return nil, fmt.Errorf("sdkfixture: commit times of %s: %w", e.Name, err)
		}
		var id string
		var at time.Time
		if _, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error { out[id] = at; return nil }); err != nil {
			return nil, fmt.Errorf("sdkfixture: commit times of %s: %w", e.Name, err)
		}
	}
	return out, nil
}

// TurnHolders returns the application_name of every session of this
// database that holds a drain's turn or next turn (store.DrainTurnClass).
func TurnHolders(ctx context.Context, db Querier) ([]string, error) {
	rows, err := db.Query(ctx, `SELECT coalesce(a.application_name, '') FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.classid::int = hashtext($1)
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`, store.DrainTurnClass)
	if err != nil {
		return nil, fmt.Errorf("sdkfixture: turn holders: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// LifecycleWaiters counts the sessions of this database waiting for the
// SDK's lifecycle lock.
func LifecycleWaiters(ctx context.Context, db Querier) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
		AND classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid AND objid = (hashtextextended($1, 0) & 4294967295)::oid
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, LifecycleLock).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("sdkfixture: lifecycle waiters: %w", err)
	}
	return n, nil
}

// HoldLifecycleLock holds the SDK's lifecycle lock exclusively as a
// migration does (the singleton row, then the lock) on a transaction of
// db until release is called.
func HoldLifecycleLock(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}) (release func(), err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("sdkfixture: hold the lifecycle lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT FROM _ontology_replication WHERE id FOR UPDATE`); err != nil {
		_ = tx.Rollback(ctx)
		return nil, fmt.Errorf("sdkfixture: hold the lifecycle lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, LifecycleLock); err != nil {
		_ = tx.Rollback(ctx)
		return nil, fmt.Errorf("sdkfixture: hold the lifecycle lock: %w", err)
	}
	return func() { _ = tx.Commit(context.WithoutCancel(ctx)) }, nil
}
