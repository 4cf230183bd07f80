package store

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The source's read for an audit, in pages.
//
// A record's latest state needs every event of the record, and a
// checksum of latest states does not compose across pages of events, so
// the read cannot simply be cut into independent pages. Read in one
// statement, an entity's events must fit in the store's statement timeout
// (about 5 s of CPU per million events), and that statement holds its
// table's share lock for as long, which a lifecycle operation's exclusive
// lock would queue behind. Instead an audit collects latest states in a
// temporary table of its own session (private to it, written without WAL,
// dropped at the end), page by page: each page is a statement and a
// transaction of its own, with the store's timeouts, that reads the next
// Config.AuditPageEvents events of an entity's history table by revision
// (the seed's index on (replication->>'revision')::bigint) or of the
// baselines by id (their primary key), and appends each record's event of
// the highest revision in the page (a tombstone winning a tie). The
// buckets and the records of differing buckets are then read from that
// table, each record's latest row taken across its pages: one statement
// over the table, which holds no lock anyone else waits on.
//
// Every event the audit judges has a revision at or below the watermark,
// and the watermark is fenced (AuditMark: every transaction that could
// still commit such an event has ended before the first page), so pages
// read at different moments see the same events.
//
// The session needs the TEMPORARY privilege on the database, which
// PostgreSQL grants to every role unless it was revoked.

// DefaultAuditPageEvents is how many events one page of an audit's source
// read takes by default (Config.AuditPageEvents).
const DefaultAuditPageEvents = 50_000

// nilUUID is below every baseline id (gen_random_uuid never returns it): the
// baselines' first page starts after it.
const nilUUID = "00000000-0000-0000-0000-000000000000"

const (
	// sqlAuditTable creates the session's table of latest states: for each
	// page, one row per entity, record kind and key with the record's
	// latest event in that page. It has no index: appending is half the
	// cost of keeping one row per record up to date under a primary key
	// (measured with BenchmarkAudit: 5.4 against 10.2 s of PostgreSQL CPU
	// for a million records), and the reads below take each record's
	// latest row.
	sqlAuditTable = `CREATE TEMPORARY TABLE IF NOT EXISTS _ontology_replication_audit (
         entity_id text NOT NULL, kind text NOT NULL, key text NOT NULL,
         revision bigint NOT NULL, deleted boolean NOT NULL, id uuid NOT NULL)`
	sqlAuditTableEmpty = `TRUNCATE pg_temp._ontology_replication_audit`
	// sqlAuditSession keeps the session open while it waits for BigQuery,
	// whatever idle_session_timeout the role or database sets, which would
	// end an audit's session, and its table, in an audit query's minutes;
	// Close resets it.
	sqlAuditSession   = `SELECT set_config('idle_session_timeout', '0', false)`
	sqlAuditTableDrop = `DROP TABLE IF EXISTS pg_temp._ontology_replication_audit`

	// sqlAuditHistoryPage is one page of an entity's part of
	// replicationEventsSql (seed 001): the next $4 captured rows of its
	// history table (%s, the quoted identifier, checked against the
	// capture-trigger tables) after revision $2 (at first the target's
	// from_revision) up to the watermark $3, in revision order from the
	// seed's index; of those, the target's source's ($1) are kept as the
	// entity's ($5). It returns the page's size and last revision.
	sqlAuditHistoryPage = `WITH page AS MATERIALIZED (
         SELECT replication, (replication->>'revision')::bigint AS revision, id FROM %s
          WHERE replication IS NOT NULL AND (replication->>'revision')::bigint > $2::bigint
            AND (replication->>'revision')::bigint <= $3::bigint
          ORDER BY (replication->>'revision')::bigint LIMIT $4
       ), latest AS (
         SELECT DISTINCT ON (kind, key) $5::text AS entity_id, kind, key, revision, deleted, id FROM (
           SELECT replication->>'record_kind' AS kind, replication->>'record_key' AS key, revision,
                  (replication->>'deleted')::boolean AS deleted, id
             FROM page WHERE replication->>'source_id' = $1) e
          ORDER BY kind, key, revision DESC, deleted DESC
       ), ` + sqlAuditKeepLatest + `
       SELECT count(*), coalesce(max(revision), $2::bigint) FROM page`

	// sqlAuditBaselinePage is one page of the baselines' part of
	// replicationEventsSql (seed 001): the next $2 baseline rows by id
	// after $1, of every generation (the table's only index is its primary
	// key); of those, generation $3's events of the audited entities ($4)
	// up to the watermark ($5) are kept. It returns the page's size and
	// last id.
	sqlAuditBaselinePage = `WITH page AS MATERIALIZED (
         SELECT id, generation, event FROM _ontology_replication_baselines WHERE id > $1::uuid ORDER BY id LIMIT $2
       ), latest AS (
         SELECT DISTINCT ON (entity_id, kind, key) entity_id, kind, key, revision, deleted, id FROM (
           SELECT event->>'entity_id' AS entity_id, event->>'record_kind' AS kind, event->>'record_key' AS key,
                  (event->>'revision')::bigint AS revision, (event->>'deleted')::boolean AS deleted, id
             FROM page WHERE generation = $3::uuid AND event->>'entity_id' = ANY ($4::text[])) e
          WHERE revision <= $5::bigint
          ORDER BY entity_id, kind, key, revision DESC, deleted DESC
       ), ` + sqlAuditKeepLatest + `
       SELECT count(*), coalesce((SELECT id FROM page ORDER BY id DESC LIMIT 1), $1::uuid)::text FROM page`

	// sqlAuditKeepLatest appends a page's latest events (latest: one row
	// per record of the page) to the session's table.
	sqlAuditKeepLatest = `kept AS (
         INSERT INTO pg_temp._ontology_replication_audit (entity_id, kind, key, revision, deleted, id)
         SELECT entity_id, kind, key, revision, deleted, id FROM latest
       )`

	// sqlAuditSourceBuckets groups an entity's ($1) latest states into
	// buckets of $2 digits (see audit.go).
	sqlAuditSourceBuckets = `SELECT kind, substr(md5(key), 1, $2::int) AS bucket, count(*),
         bit_xor(('x' || substr(md5(key || ':' || latest::text), 1, 15))::bit(60)::bigint)
       FROM (SELECT kind, key, max(revision * 2 + deleted::int) AS latest
               FROM pg_temp._ontology_replication_audit WHERE entity_id = $1 GROUP BY kind, key) r
      GROUP BY kind, bucket`

	// sqlAuditSourceRecords reads an entity's ($2) latest states whose
	// md5(record_key) starts with one of the prefixes ($4, of $3 digits),
	// or, when $5 is not NULL, of those records only, with when each latest
	// event was verified in generation $1 (%s: sqlAuditVerifiedV4 or V3).
	sqlAuditSourceRecords = `SELECT l.kind, l.key, l.revision, l.deleted, l.id::text, v.verified_at FROM (
         SELECT DISTINCT ON (kind, key) kind, key, revision, deleted, id FROM pg_temp._ontology_replication_audit
          WHERE entity_id = $2 AND substr(md5(key), 1, $3::int) = ANY ($4::text[])
            AND ($5::text[] IS NULL OR key = ANY ($5::text[]))
          ORDER BY kind, key, revision * 2 + deleted::int DESC
       ) l %s`
)

// AuditSource is the source's side of one audit: the latest state of the
// audited entities' records as of a watermark, read in pages into its
// session (see above). It holds one connection of the store's pool until
// Close. It is not safe for concurrent use.
type AuditSource struct {
	store *Store
	conn  *pgxpool.Conn
	t     Target
	pages int
}

// OpenAudit reads the latest state of the records of the given entities
// of t (each selected by t) as of watermark, page by page. The caller must
// Close the AuditSource.
func (s *Store) OpenAudit(ctx context.Context, t Target, watermark int64, entityIDs []string) (*AuditSource, error) {
	fail := func(err error) (*AuditSource, error) {
		return nil, fmt.Errorf("store: read the source for an audit of %s: %w", t.Generation, err)
	}
	for _, id := range entityIDs {
		if !slices.ContainsFunc(t.Selection, func(sel Selection) bool { return sel.EntityID == id }) {
			return fail(fmt.Errorf("entity %q is not selected by the target", id))
		}
	}
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return fail(err)
	}
	a := &AuditSource{store: s, conn: conn, t: t}
	if err := a.fill(ctx, watermark, entityIDs); err != nil {
		a.Close(ctx)
		return fail(err)
	}
	return a, nil
}

// fill empties the session's table and reads every page into it.
func (a *AuditSource) fill(ctx context.Context, watermark int64, entityIDs []string) error {
	if err := a.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlAuditSession); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlAuditTable); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sqlAuditTableEmpty)
		return err
	}); err != nil {
		return fmt.Errorf("create the session's audit table: %w", err)
	}
	size := a.store.cfg.AuditPageEvents
	for cursor, n := nilUUID, size; n == size; {
		if err := a.inTx(ctx, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, sqlAuditBaselinePage, cursor, size, a.t.Generation, entityIDs, watermark).Scan(&n, &cursor)
		}); err != nil {
			return fmt.Errorf("read the baselines after %s: %w", cursor, err)
		}
		a.pages++
	}
	for _, id := range entityIDs {
		for cursor, n := a.t.FromRevision, size; n == size; {
			err := a.store.retryRenamed(func() error {
				return a.inTx(ctx, func(tx pgx.Tx) error {
					table, err := a.store.entityHistoryTable(ctx, tx, id)
					if err != nil {
						return err
					}
					ident, err := a.store.historyTable(ctx, tx, table)
					if err != nil {
						return err
					}
					return tx.QueryRow(ctx, fmt.Sprintf(sqlAuditHistoryPage, ident), a.t.SourceID, cursor, watermark, size, id).Scan(&n, &cursor)
				})
			})
			if err != nil {
				return fmt.Errorf("read the history of entity %s after revision %d: %w", id, cursor, err)
			}
			a.pages++
		}
	}
	return nil
}

// inTx runs fn in a transaction of the session with the store's timeouts.
func (a *AuditSource) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return a.store.inTxOnce(ctx, a.conn, false, fn)
}

// Buckets returns the buckets (of AuditBucketDigits digits) of an
// entity's records.
func (a *AuditSource) Buckets(ctx context.Context, entityID string) ([]AuditBucket, error) {
	var out []AuditBucket
	err := a.inTx(ctx, func(tx pgx.Tx) error {
		out = out[:0]
		rows, err := tx.Query(ctx, sqlAuditSourceBuckets, entityID, AuditBucketDigits)
		if err != nil {
			return err
		}
		b := AuditBucket{EntityID: entityID}
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

// Records returns the latest state of an entity's records whose
// md5(record_key) starts with one of prefixes (all of the same length),
// or, when keys is not nil, of those records only, with when each latest
// event was verified (read now, from its delivery row or, at protocol 3,
// its receipt).
func (a *AuditSource) Records(ctx context.Context, entityID string, prefixes, keys []string) ([]AuditRecord, error) {
	if len(prefixes) == 0 {
		return nil, nil
	}
	digits := len(prefixes[0])
	for _, p := range prefixes {
		if len(p) != digits || digits == 0 || digits > 32 {
			return nil, fmt.Errorf("store: audit records of entity %s: prefixes of different or invalid lengths", entityID)
		}
	}
	verified := sqlAuditVerifiedV3
	if a.t.UsesDelivery() {
		verified = sqlAuditVerifiedV4
	}
	var out []AuditRecord
	err := a.inTx(ctx, func(tx pgx.Tx) error {
		out = out[:0]
		rows, err := tx.Query(ctx, fmt.Sprintf(sqlAuditSourceRecords, verified), a.t.Generation, entityID, digits, prefixes, keys)
		if err != nil {
			return err
		}
		r := AuditRecord{EntityID: entityID}
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

// Now reads the database's clock, the one verified_at is written with, on
// the audit's session.
func (a *AuditSource) Now(ctx context.Context) (time.Time, error) {
	return readNow(ctx, a.inTx)
}

// Close drops the session's table and gives the connection back to the
// pool; a connection whose table could not be dropped is closed instead.
// It is safe to call more than once.
func (a *AuditSource) Close(ctx context.Context) {
	if a.conn == nil {
		return
	}
	defer func() { a.conn = nil }()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.store.cfg.StatementTimeout)
	defer cancel()
	if _, err := a.conn.Exec(ctx, sqlAuditTableDrop+"; "+sqlResetIdle); err != nil {
		_ = a.conn.Conn().Close(ctx)
		a.store.cfg.Logger.WarnContext(ctx, "replication: store: could not drop an audit's session table; closed its connection",
			slog.String("error", err.Error()))
	}
	a.conn.Release()
}
