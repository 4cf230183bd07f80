package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The source side of an audit (`job audit`, `job repair`): a target's
// latest state per record, as the SDK captured it, compared with the
// warehouse's latest state first by checksummed buckets of records and then
// record by record where a bucket differs.
//
// A generation's events are the seed's replicationEventsSql (see
// legacyEvents): its baselines and, in each selected entity's history
// table, the captured rows of its source after its from_revision. Every
// event carries its record's key, kind, revision and deleted flag; a
// record's latest state is its event of the highest revision (revisions
// come from one counter, so no two events share one; a tombstone wins a tie,
// as the ranking of the views puts it first). The audit judges the state as
// of a watermark, the revision counter's value when it starts (AuditMark):
// events captured later are left out on both sides.
//
// Both sides write a latest state as one number, revision × 2 + deleted
// (1 for a tombstone), and a record's hash as the first 15 hex digits of
// md5(record_key || ':' || that number) read as a 60-bit integer; a bucket
// is the records whose md5(record_key) starts with the same hex digits, and
// its checksum the XOR of their hashes. XOR and counts compose, so buckets
// of more digits merge into buckets of fewer (MergeBuckets). The warehouse
// computes the same figures in BigQuery SQL (warehouse.BigQuery.AuditBuckets).

// AuditBucketDigits is how many hex digits of md5(record_key) the store's
// buckets share: 4,096 buckets per entity and kind at most.
const AuditBucketDigits = 3

// AuditMark is where an audit judges: the revision counter's value when it
// started (events of a higher revision are left out) and the database's
// clock then.
type AuditMark struct {
	Revision int64
	At       time.Time
}

// AuditBucket is one bucket of a target's records: an entity, a record kind
// ("entity" or "edge:<relationship>") and the hex digits its records'
// md5(record_key) starts with; how many records it holds, and the XOR of
// their hashes.
type AuditBucket struct {
	EntityID string
	Kind     string
	Bucket   string
	Records  int64
	Checksum int64
}

// AuditRecord is a record's latest state at the source: its latest event's
// revision, deleted flag and history id, and when that event was verified
// in BigQuery (nil: not yet).
type AuditRecord struct {
	EntityID   string
	Kind       string
	Key        string
	Revision   int64
	Deleted    bool
	HistoryID  string
	VerifiedAt *time.Time
}

// sqlAuditMarkV4 and sqlAuditMarkV3 read the watermark: the revision
// sequence's current value (as replay initialisation fences, seed 000) or,
// at protocol 3, the singleton's revision counter (seed 001); and the
// database's clock.
const (
	sqlAuditMarkV4 = `SELECT CASE WHEN is_called THEN last_value ELSE 0 END, clock_timestamp() FROM _ontology_replication_revision`
	sqlAuditMarkV3 = `SELECT revision, clock_timestamp() FROM _ontology_replication WHERE id`
	sqlNow         = `SELECT clock_timestamp()`
)

// sqlAuditEvents is one entity's part of replicationEventsSql (seed 001)
// with each event's record, revision and deleted flag: its baseline events
// (the baselines of every entity share one table, so they are filtered by
// entity) and the captured rows of its history table (%s, the quoted
// identifier, checked against the capture-trigger tables) of the target's
// source after its from_revision, as sqlLegacyHistoryEvents. $1 generation,
// $2 source, $3 from_revision, $4 entity id.
const sqlAuditEvents = `SELECT event->>'record_kind' AS kind, event->>'record_key' AS key,
         (event->>'revision')::bigint AS revision, (event->>'deleted')::boolean AS deleted, id
    FROM _ontology_replication_baselines WHERE generation = $1::uuid AND event->>'entity_id' = $4
  UNION ALL
  SELECT replication->>'record_kind', replication->>'record_key',
         (replication->>'revision')::bigint, (replication->>'deleted')::boolean, id
    FROM %s WHERE replication IS NOT NULL AND replication->>'source_id' = $2
     AND (replication->>'revision')::bigint > $3::bigint`

// sqlAuditBuckets groups an entity's records up to the watermark ($5) into
// buckets of AuditBucketDigits digits ($6): one pass over its events, a
// hash aggregate per record, and one per bucket. %s is sqlAuditEvents.
const sqlAuditBuckets = `SELECT kind, bucket, count(*), bit_xor(hash) FROM (
    SELECT kind, substr(md5(key), 1, $6::int) AS bucket,
           ('x' || substr(md5(key || ':' || latest::text), 1, 15))::bit(60)::bigint AS hash
      FROM (SELECT kind, key, max(revision * 2 + deleted::int) AS latest FROM (%s) e
             WHERE revision <= $5::bigint GROUP BY kind, key) r
  ) b GROUP BY kind, bucket`

// sqlAuditRecords reads the latest state of an entity's records up to the
// watermark ($5) whose md5(record_key) starts with one of the prefixes ($7,
// of $6 digits), or, when $8 is not NULL, of those records only, with when
// each latest event was verified: from its delivery row (%[2]s is
// sqlAuditVerifiedV4) or, at protocol 3, its receipt (sqlAuditVerifiedV3).
// %[1]s is sqlAuditEvents.
const sqlAuditRecords = `SELECT l.kind, l.key, l.revision, l.deleted, l.id::text, v.verified_at FROM (
    SELECT DISTINCT ON (kind, key) kind, key, revision, deleted, id FROM (%[1]s) e
     WHERE revision <= $5::bigint AND substr(md5(key), 1, $6::int) = ANY ($7::text[])
       AND ($8::text[] IS NULL OR key = ANY ($8::text[]))
     ORDER BY kind, key, revision DESC, deleted DESC
  ) l %[2]s`

const (
	sqlAuditVerifiedV4 = `LEFT JOIN _ontology_replication_delivery v ON v.generation = $1::uuid AND v.event_id = l.id`
	sqlAuditVerifiedV3 = `LEFT JOIN _ontology_replication_receipts v ON v.generation = $1::uuid AND v.event_id = l.id`
)

// AuditMark reads the watermark an audit of t judges at.
func (s *Store) AuditMark(ctx context.Context, t Target) (AuditMark, error) {
	var m AuditMark
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		q := sqlAuditMarkV3
		if t.DatabaseAtDelivery() {
			q = sqlAuditMarkV4
		}
		return tx.QueryRow(ctx, q).Scan(&m.Revision, &m.At)
	})
	if err != nil {
		return AuditMark{}, fmt.Errorf("store: read the audit watermark: %w", err)
	}
	return m, nil
}

// Now reads the database's clock, the one verified_at is written with.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := s.inTx(ctx, func(tx pgx.Tx) error { return tx.QueryRow(ctx, sqlNow).Scan(&now) }); err != nil {
		return time.Time{}, fmt.Errorf("store: read the database's clock: %w", err)
	}
	return now, nil
}

// auditEvents builds sqlAuditEvents for an entity of t.
func (s *Store) auditEvents(ctx context.Context, tx pgx.Tx, t Target, entityID string) (string, error) {
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
	return fmt.Sprintf(sqlAuditEvents, ident), nil
}

// AuditBuckets returns the buckets (of AuditBucketDigits digits) of an
// entity's records in t as of the watermark, in one statement of its own
// transaction: it reads the entity's baselines and history table once, as
// a count(*) of them does, and takes no lock beyond the tables' share
// locks that every read takes.
func (s *Store) AuditBuckets(ctx context.Context, t Target, entityID string, watermark int64) ([]AuditBucket, error) {
	var out []AuditBucket
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		out = out[:0]
		events, err := s.auditEvents(ctx, tx, t, entityID)
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, fmt.Sprintf(sqlAuditBuckets, events), t.Generation, t.SourceID, t.FromRevision, entityID,
			watermark, AuditBucketDigits)
		if err != nil {
			return err
		}
		var b AuditBucket
		b.EntityID = entityID
		_, err = pgx.ForEachRow(rows, []any{&b.Kind, &b.Bucket, &b.Records, &b.Checksum}, func() error {
			out = append(out, b)
			return nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: audit buckets of entity %s: %w", entityID, err)
	}
	return out, nil
}

// AuditRecords returns the latest state of an entity's records in t as of
// the watermark whose md5(record_key) starts with one of prefixes (all of
// the same length), or, when keys is not nil, of those records only, with
// when each latest event was verified.
func (s *Store) AuditRecords(ctx context.Context, t Target, entityID string, watermark int64, prefixes, keys []string) ([]AuditRecord, error) {
	if len(prefixes) == 0 {
		return nil, nil
	}
	digits := len(prefixes[0])
	for _, p := range prefixes {
		if len(p) != digits || digits == 0 || digits > 32 {
			return nil, fmt.Errorf("store: audit records of entity %s: prefixes of different or invalid lengths", entityID)
		}
	}
	var out []AuditRecord
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		out = out[:0]
		events, err := s.auditEvents(ctx, tx, t, entityID)
		if err != nil {
			return err
		}
		verified := sqlAuditVerifiedV3
		if t.UsesDelivery() {
			verified = sqlAuditVerifiedV4
		}
		rows, err := tx.Query(ctx, fmt.Sprintf(sqlAuditRecords, events, verified), t.Generation, t.SourceID, t.FromRevision, entityID,
			watermark, digits, prefixes, keys)
		if err != nil {
			return err
		}
		var r AuditRecord
		r.EntityID = entityID
		var at pgtype.Timestamptz
		_, err = pgx.ForEachRow(rows, []any{&r.Kind, &r.Key, &r.Revision, &r.Deleted, &r.HistoryID, &at}, func() error {
			rec := r
			if at.Valid {
				v := at.Time
				rec.VerifiedAt = &v
			}
			out = append(out, rec)
			return nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: audit records of entity %s: %w", entityID, err)
	}
	return out, nil
}

// RedeliverPageSize is how many events one Redeliver transaction sends back
// to pending.
const RedeliverPageSize = 1000

// sqlRedeliver sends chosen delivered events of a generation back to
// pending (the store's own statement, for `job repair`): the replay page's
// reset (advanceReplicationReplay, seed 000, sqlReplayPage) over the given
// history ids ($2) instead of the next page by cursor. Only rows of the
// generation ($1) that are accepted are reset (a pending row is on its way
// already, and resetting it would end a set-aside's backoff); they are found
// by primary key and locked in key order (see sqlSetKeyOrder), after the
// target row, as a replay page takes them; the verified ones are
// subtracted from verified_count, so the SDK's counts stay true. It returns
// the rows reset, how many had been verified, and their ids.
const sqlRedeliver = `WITH page AS (
         SELECT event_id, verified_at IS NOT NULL AS verified FROM _ontology_replication_delivery
          WHERE generation = $1::uuid AND event_id = ANY (ARRAY(SELECT unnest($2::uuid[])))
            AND (CASE WHEN accepted_at IS NOT NULL THEN true END)
       ), reset AS (
         UPDATE _ontology_replication_delivery SET accepted_at = NULL, verified_at = NULL, next_verify_at = now()
          WHERE generation = $1::uuid AND event_id = ANY (ARRAY(SELECT event_id FROM page))
          RETURNING event_id
       ), summary AS (
         SELECT count(*) AS rows, count(*) FILTER (WHERE verified) AS verified FROM page
       )
       UPDATE _ontology_replication_targets t SET verified_count = t.verified_count - s.verified
         FROM summary s WHERE t.generation = $1::uuid
       RETURNING s.rows, s.verified, (SELECT coalesce(array_agg(event_id), '{}') FROM reset)`

// sqlLockTarget locks a target row as a replay page does (sqlReplayTarget)
// before it resets delivery rows.
const sqlLockTarget = `SELECT 1 FROM _ontology_replication_targets WHERE generation = $1::uuid FOR NO KEY UPDATE`

// sqlRedeliverLegacy is the protocol-3 form: the legacy retry's DELETE of
// receipts (retryUnverifiedReplication, seed 000) over the given ids,
// without its age and verification conditions, as the legacy replay
// deletes every receipt of the generation. An event without a receipt is
// pending.
const sqlRedeliverLegacy = `DELETE FROM _ontology_replication_receipts
       WHERE generation = $1::uuid AND event_id = ANY (ARRAY(SELECT unnest($2::uuid[])))
       RETURNING verified_at IS NOT NULL`

// Redelivered is what Redeliver did.
type Redelivered struct {
	// Rows is how many events went back to pending; Verified how many of
	// them had been verified.
	Rows, Verified int
}

// Redeliver sends the events of the given history ids (at most
// RedeliverPageSize) back to pending in generation t only, in one
// transaction: a repair stopped between pages keeps what it reset, and the
// next run finds those events pending. Events already pending, and ids the
// generation has no row for, are left alone.
func (s *Store) Redeliver(ctx context.Context, t Target, historyIDs []string) (Redelivered, error) {
	if len(historyIDs) > RedeliverPageSize {
		return Redelivered{}, fmt.Errorf("store: redeliver: %d events, more than a page (%d)", len(historyIDs), RedeliverPageSize)
	}
	ids, err := uuids(historyIDs)
	if err != nil {
		return Redelivered{}, fmt.Errorf("store: redeliver: %w", err)
	}
	var done Redelivered
	if !t.DatabaseAtDelivery() {
		err = s.inTx(ctx, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, sqlRedeliverLegacy, t.Generation, ids)
			if err != nil {
				return err
			}
			var verified bool
			done = Redelivered{}
			_, err = pgx.ForEachRow(rows, []any{&verified}, func() error {
				done.Rows++
				if verified {
					done.Verified++
				}
				return nil
			})
			return err
		})
	} else {
		err = s.inKeyOrderTx(ctx, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, sqlLockTarget, t.Generation)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return fmt.Errorf("%w: %s", ErrUnknownGeneration, t.Generation)
			}
			var rows, verified int64
			var reset []pgtype.UUID
			if err := tx.QueryRow(ctx, sqlRedeliver, t.Generation, ids).Scan(&rows, &verified, &reset); err != nil {
				return err
			}
			if len(reset) > 0 {
				if _, err := tx.Exec(ctx, sqlReplayReceipts, t.Generation, reset); err != nil {
					return err
				}
			}
			done = Redelivered{Rows: int(rows), Verified: int(verified)}
			return nil
		})
	}
	if err != nil {
		return Redelivered{}, fmt.Errorf("store: redeliver events of %s: %w", t.Generation, err)
	}
	return done, nil
}

// MergeBuckets merges buckets into buckets of fewer digits (their
// prefixes): counts add, checksums XOR.
func MergeBuckets(buckets []AuditBucket, digits int) []AuditBucket {
	type key struct{ entity, kind, bucket string }
	merged := map[key]*AuditBucket{}
	var order []key
	for _, b := range buckets {
		k := key{b.EntityID, b.Kind, b.Bucket[:min(digits, len(b.Bucket))]}
		m, ok := merged[k]
		if !ok {
			m = &AuditBucket{EntityID: k.entity, Kind: k.kind, Bucket: k.bucket}
			merged[k] = m
			order = append(order, k)
		}
		m.Records += b.Records
		m.Checksum ^= b.Checksum
	}
	out := make([]AuditBucket, len(order))
	for i, k := range order {
		out[i] = *merged[k]
	}
	return out
}
