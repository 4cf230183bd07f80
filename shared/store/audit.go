package store

import (
	"context"
	"errors"
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
// record's latest state is its event of the highest revision. Revisions
// come from one counter, so two events of a record share a revision only
// where a baseline restates a captured event; on such a tie the audit takes
// the tombstone (the higher revision × 2 + deleted, below), while the views
// keep the row of the higher event_id (ROW_NUMBER by revision, then
// event_id): the two agree because the tied events are the same state.
// The audit judges the state as of a watermark, the revision counter's
// value when it starts (AuditMark, fenced): events captured later are left
// out on both sides.
//
// Both sides write a latest state as one number, revision × 2 + deleted
// (1 for a tombstone), and a record's hash as the first 15 hex digits of
// md5(record_key || ':' || that number) read as a 60-bit integer; a bucket
// is the records whose md5(record_key) starts with the same hex digits, and
// its checksum the XOR of their hashes. XOR and counts compose, so buckets
// of more digits merge into buckets of fewer (MergeBuckets). The warehouse
// computes the same figures in BigQuery SQL (warehouse.BigQuery.AuditBuckets).
// The source's side is read in pages into the audit's session
// (AuditSource, auditsource.go), so that no statement grows with the
// entity's history.

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

const (
	sqlAuditVerifiedV4 = `LEFT JOIN _ontology_replication_delivery v ON v.generation = $1::uuid AND v.event_id = l.id`
	sqlAuditVerifiedV3 = `LEFT JOIN _ontology_replication_receipts v ON v.generation = $1::uuid AND v.event_id = l.id`
)

// The watermark's fence. At protocol 4 a revision comes from a sequence,
// and nextval is not transactional: a writer may hold a revision at or
// below the watermark and commit after the audit's pages have read past
// it, and its event would then be in the warehouse and missing from the
// source's read, a difference that is not there. So after reading the
// watermark the audit waits until every transaction that could still
// commit such an event has ended, as CREATE INDEX CONCURRENTLY waits for
// the transactions older than its snapshot: those that were open in this
// database when the watermark was read and either hold the SDK's lifecycle
// lock (every SDK write takes it shared first, beginReplicationWrite, seed
// 000) or have a transaction id (any other writer of a history row).
// Transactions that start later take later revisions. pg_locks and the
// columns of pg_stat_activity read here are visible to every role. At
// protocol 3 the singleton's counter is a row that its writer holds until
// it commits, so the same wait is cheap and changes nothing.

// sqlAuditFenceHolders lists the virtual transaction ids of those
// transactions ($1: LifecycleLock).
const sqlAuditFenceHolders = `SELECT coalesce(array_agg(DISTINCT v.virtualxid), '{}') FROM pg_locks v
    JOIN pg_stat_activity a ON a.pid = v.pid
   WHERE v.locktype = 'virtualxid' AND v.granted AND v.virtualxid = v.virtualtransaction
     AND a.datid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND a.pid <> pg_backend_pid()
     AND (a.backend_xid IS NOT NULL OR EXISTS (
           SELECT FROM pg_locks l WHERE l.pid = v.pid AND l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
              AND l.database = a.datid
              AND l.classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid
              AND l.objid = (hashtextextended($1, 0) & 4294967295)::oid))`

// sqlAuditFenceOpen counts those of them still open.
const sqlAuditFenceOpen = `SELECT count(*), coalesce(array_agg(pid), '{}') FROM pg_locks
   WHERE locktype = 'virtualxid' AND granted AND virtualxid = ANY ($1::text[]) AND virtualxid = virtualtransaction`

// auditFencePoll is how often the fence looks whether the transactions it
// waits for have ended (SQL has no way to wait on another transaction).
const auditFencePoll = 10 * time.Millisecond

// ErrAuditFence: transactions that were open when an audit's watermark was
// read did not end within Config.AuditFenceTimeout.
var ErrAuditFence = errors.New("transactions open when the audit's watermark was read are still open")

// AuditMark reads the watermark an audit of t judges at, and returns once
// every transaction that could still commit an event at or below it has
// ended (see the fence above), or fails with ErrAuditFence after
// Config.AuditFenceTimeout.
func (s *Store) AuditMark(ctx context.Context, t Target) (AuditMark, error) {
	var m AuditMark
	var holders []string
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		q := sqlAuditMarkV3
		if t.DatabaseAtDelivery() {
			q = sqlAuditMarkV4
		}
		if err := tx.QueryRow(ctx, q).Scan(&m.Revision, &m.At); err != nil {
			return err
		}
		// A statement of its own, so that its view of the open
		// transactions is taken after the mark was read.
		return tx.QueryRow(ctx, sqlAuditFenceHolders, LifecycleLock).Scan(&holders)
	})
	if err != nil {
		return AuditMark{}, fmt.Errorf("store: read the audit watermark: %w", err)
	}
	if err := s.awaitFence(ctx, holders); err != nil {
		return AuditMark{}, fmt.Errorf("store: fence the audit watermark %d: %w", m.Revision, err)
	}
	return m, nil
}

// awaitFence waits until none of the virtual transactions is open.
func (s *Store) awaitFence(ctx context.Context, vxids []string) error {
	deadline := time.Now().Add(s.cfg.AuditFenceTimeout)
	for len(vxids) > 0 {
		var open int
		var pids []int32
		if err := s.inTx(ctx, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, sqlAuditFenceOpen, vxids).Scan(&open, &pids)
		}); err != nil {
			return err
		}
		if open == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %v (%d, backend pids %v): an audit cannot judge the events they may commit; end them, or run the audit again",
				ErrAuditFence, s.cfg.AuditFenceTimeout, open, pids)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(auditFencePoll):
		}
	}
	return nil
}

// Now reads the database's clock, the one verified_at is written with.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	return readNow(ctx, s.inTx)
}

// readNow reads the database's clock in a transaction that inTx runs.
func readNow(ctx context.Context, inTx func(context.Context, func(pgx.Tx) error) error) (time.Time, error) {
	var now time.Time
	if err := inTx(ctx, func(tx pgx.Tx) error { return tx.QueryRow(ctx, sqlNow).Scan(&now) }); err != nil {
		return time.Time{}, fmt.Errorf("store: read the database's clock: %w", err)
	}
	return now, nil
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
