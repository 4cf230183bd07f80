package sdkfixture

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// DB is what the fixture runs statements on: a connection or a pool.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Install builds, in an empty database, what the SDK's migration runner builds
// for manifest m at replication protocol 3 (SDK 0.12) or 4 (SDK 0.25): the
// catalog, business, history and join tables, the replication DDL, the
// capture and guard triggers and the singleton's version. Replication is
// left paused with no generation; see StartGeneration.
func Install(ctx context.Context, db DB, m Manifest, protocol int) error {
	if protocol != 3 && protocol != 4 {
		return fmt.Errorf("sdkfixture: protocol %d: want 3 or 4", protocol)
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := execAll(ctx, tx, businessDDL(m)); err != nil {
			return err
		}
		return migrate(ctx, tx, m, protocol)
	})
}

// Upgrade applies the SDK 0.25 migration to a protocol-3 database: the v4
// REPLICATION_DDL (sequence, protocol floor, delivery table, and the UPDATE
// that marks protocol-3 targets for backfill), the v4 capture functions and
// version 4. Existing targets, receipts and the active generation stay.
func Upgrade(ctx context.Context, db DB, m Manifest) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return migrate(ctx, tx, m, 4) })
}

// migrate runs the replication part of the SDK's applyMigration.
func migrate(ctx context.Context, tx pgx.Tx, m Manifest, protocol int) error {
	ddl := replicationDDLv3
	if protocol == 4 {
		ddl = replicationDDLv4
	}
	if err := execAll(ctx, tx, ddl); err != nil {
		return err
	}
	if err := execAll(ctx, tx, entityDDL(m, protocol)); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "UPDATE _ontology_replication SET version = $1 WHERE id", protocol); err != nil {
		return fmt.Errorf("sdkfixture: set version: %w", err)
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO "_ontology" ("id", "version", "hash", "manifest")
            VALUES (true, $1, $2, $3::jsonb)
            ON CONFLICT ("id") DO UPDATE SET "version" = excluded."version", "hash" = excluded."hash",
              "manifest" = excluded."manifest", "applied_at" = now()`, m.Version, m.Hash, string(raw))
	if err != nil {
		return fmt.Errorf("sdkfixture: record catalog: %w", err)
	}
	return nil
}

func execAll(ctx context.Context, tx pgx.Tx, statements []string) error {
	for _, s := range statements {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("sdkfixture: %w in:\n%s", err, s)
		}
	}
	return nil
}

// NewUUID returns a random (version 4) uuid in PostgreSQL's text form.
func NewUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Generation describes a started generation.
type Generation struct {
	Generation   string
	SourceID     string
	FromRevision int64
	Baseline     int // baseline events written
}

// StartGeneration starts replication with a new generation and its baseline
// events, as the SDK's createReplicationBaseline does: under the singleton
// lock, with replication paused, it locks the business tables in SHARE mode,
// enables capture with the selection, records the target and writes one
// baseline event per selected record and edge.
//
// At protocol 3 this is seed 001's createReplicationBaseline. At protocol 4
// the seeds do not show the baseline code (only its effects), so this writes
// what the v4 store reads: the target with protocol 4, from_revision and
// initial_revision at the revision sequence's current value, and a delivery
// row (is_baseline, no history table) per baseline event.
func StartGeneration(ctx context.Context, db DB, m Manifest, selection []Selection, newSource bool) (Generation, error) {
	g := Generation{Generation: NewUUID()}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL statement_timeout = '30s'; SET LOCAL lock_timeout = '5s'"); err != nil {
			return err
		}
		var version int
		var enabled bool
		var revision int64
		err := tx.QueryRow(ctx, "SELECT source_id::text, revision, enabled, version FROM _ontology_replication WHERE id FOR UPDATE").
			Scan(&g.SourceID, &revision, &enabled, &version)
		if err != nil {
			return fmt.Errorf("sdkfixture: read singleton: %w", err)
		}
		if enabled {
			return errors.New("sdkfixture: pause replication before starting a new generation")
		}
		if version >= 4 {
			if err := tx.QueryRow(ctx, "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM _ontology_replication_revision").Scan(&revision); err != nil {
				return err
			}
		}
		g.FromRevision = revision
		var tables []string
		for _, e := range m.Entities {
			if !e.Replicated() {
				continue
			}
			tables = append(tables, qi(tableName(e.Name)))
			for _, r := range e.Relationships {
				if r.Cardinality == "many" {
					tables = append(tables, qi(joinTable(e.Name, r.Name)))
				}
			}
		}
		if _, err := tx.Exec(ctx, "LOCK TABLE "+joinComma(tables)+" IN SHARE MODE"); err != nil {
			return err
		}
		if newSource {
			g.SourceID = NewUUID()
		}
		bySelection := map[string]Selection{}
		for _, s := range selection {
			bySelection[s.EntityID] = s
		}
		selMap, _ := json.Marshal(bySelection)
		selArr, _ := json.Marshal(selection)
		manifest, _ := json.Marshal(m)
		if _, err := tx.Exec(ctx, `UPDATE _ontology_replication SET source_id = $1::uuid, selection = $2::jsonb, enabled = true,
          exclusions = $3::jsonb, active_generation = $4::uuid WHERE id`, g.SourceID, string(selMap), "[]", g.Generation); err != nil {
			return fmt.Errorf("sdkfixture: enable: %w", err)
		}
		if version >= 4 {
			_, err = tx.Exec(ctx, `INSERT INTO _ontology_replication_targets (generation, source_id, from_revision, manifest, selection,
          protocol, initial_revision) VALUES ($1::uuid, $2::uuid, $3::bigint, $4::jsonb, $5::jsonb, 4, $3::bigint)`,
				g.Generation, g.SourceID, revision, string(manifest), string(selArr))
		} else {
			_, err = tx.Exec(ctx, `INSERT INTO _ontology_replication_targets (generation, source_id, from_revision, manifest, selection)
     VALUES ($1::uuid, $2::uuid, $3::bigint, $4::jsonb, $5::jsonb)`, g.Generation, g.SourceID, revision, string(manifest), string(selArr))
		}
		if err != nil {
			return fmt.Errorf("sdkfixture: insert target: %w", err)
		}
		for _, s := range selection {
			e, err := m.entityByID(s.EntityID)
			if err != nil {
				return err
			}
			fields, _ := json.Marshal(s.Fields)
			records := `SELECT r.id::text AS record_key,
        (SELECT jsonb_object_agg(key, value) FROM jsonb_each(` + snapshotExpression(e, "r") + `)
         WHERE key = 'id' OR ` + ql(string(fields)) + `::jsonb ? key) AS payload
       FROM ` + qi(tableName(e.Name)) + ` r`
			n, err := baseline(ctx, tx, g, m, e.ID, "entity", records, revision)
			if err != nil {
				return err
			}
			g.Baseline += n
			for _, name := range s.Relationships {
				var rel Relationship
				for _, r := range e.Relationships {
					if r.Name == name {
						rel = r
					}
				}
				src, dst := joinColumns(e.Name, rel)
				records := `SELECT ` + qi(src) + `::text || ':' || ` + qi(dst) + `::text AS record_key,
          jsonb_build_object('source_id', ` + qi(src) + `::text,
            'target_id', ` + qi(dst) + `::text) AS payload
         FROM ` + qi(joinTable(e.Name, name))
				n, err := baseline(ctx, tx, g, m, e.ID, "edge:"+name, records, revision)
				if err != nil {
					return err
				}
				g.Baseline += n
			}
		}
		if version >= 4 {
			_, err = tx.Exec(ctx, `INSERT INTO _ontology_replication_delivery (generation, event_id, history_table, revision, is_baseline)
          SELECT generation, id, NULL, (event->>'revision')::bigint, true FROM _ontology_replication_baselines WHERE generation = $1::uuid`, g.Generation)
			if err != nil {
				return fmt.Errorf("sdkfixture: enqueue baseline: %w", err)
			}
		}
		return nil
	})
	return g, err
}

func baseline(ctx context.Context, tx pgx.Tx, g Generation, m Manifest, entityID, kind, records string, revision int64) (int, error) {
	tag, err := tx.Exec(ctx, `INSERT INTO _ontology_replication_baselines (generation, event)
      SELECT $1::uuid, jsonb_build_object('source_id', $2::text, 'entity_id', $3::text,
        'record_key', record_key, 'record_kind', $4::text, 'revision', $5::text,
        'deleted', false, 'schema_hash', $6::text, 'payload', payload::text)
      FROM (`+records+`) snapshot`, g.Generation, g.SourceID, entityID, kind, fmt.Sprint(revision), m.Hash)
	if err != nil {
		return 0, fmt.Errorf("sdkfixture: baseline %s %s: %w", entityID, kind, err)
	}
	return int(tag.RowsAffected()), nil
}

// Pause pauses replication as the SDK's pauseReplication does at protocol 4
// (singleton, then the exclusive lifecycle lock) or 3 (a plain update).
func Pause(ctx context.Context, db DB) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var version int
		if err := tx.QueryRow(ctx, "SELECT version FROM _ontology_replication WHERE id FOR UPDATE").Scan(&version); err != nil {
			return err
		}
		if version >= 4 {
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", LifecycleLock); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, "UPDATE _ontology_replication SET enabled = false WHERE id")
		return err
	})
}

// LifecycleLock is the SDK's REPLICATION_LIFECYCLE_LOCK.
const LifecycleLock = "segmentstream.ontology.replication.lifecycle"

func joinComma(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += ", "
		}
		out += v
	}
	return out
}
