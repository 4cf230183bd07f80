package sdkfixture

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The statements below are the SDK's, verbatim but for the template values
// the SDK substitutes: REPLICATION_DDL of replication/schema.js at 0.12.0
// (seed 001, protocol 3) and at 0.25.0 (seed 000, protocol 4).

const ddlSingleton = `CREATE TABLE IF NOT EXISTS _ontology_replication (
    id boolean PRIMARY KEY DEFAULT true CHECK (id), version integer NOT NULL,
    source_id uuid NOT NULL DEFAULT gen_random_uuid(), revision bigint NOT NULL DEFAULT 0,
    selection jsonb NOT NULL DEFAULT '{}'::jsonb, enabled boolean NOT NULL DEFAULT false
  )`

const ddlTargets = `CREATE TABLE IF NOT EXISTS _ontology_replication_targets (
    generation uuid PRIMARY KEY, source_id uuid NOT NULL, from_revision bigint NOT NULL,
    manifest jsonb NOT NULL, selection jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now()
  )`

const ddlBaselines = `CREATE TABLE IF NOT EXISTS _ontology_replication_baselines (
    generation uuid NOT NULL REFERENCES _ontology_replication_targets(generation),
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(), event jsonb NOT NULL
  )`

const ddlReceipts = `CREATE TABLE IF NOT EXISTS _ontology_replication_receipts (
    generation uuid NOT NULL REFERENCES _ontology_replication_targets(generation),
    event_id uuid NOT NULL, accepted_at timestamptz NOT NULL DEFAULT now(), verified_at timestamptz,
    PRIMARY KEY (generation, event_id)
  )`

const ddlGuardV3 = `CREATE OR REPLACE FUNCTION _ontology_replication_guard() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN
    IF (SELECT enabled FROM _ontology_replication WHERE id) AND
       current_setting('segmentstream.writer', true) IS DISTINCT FROM '1' THEN
      RAISE EXCEPTION 'Replication requires a compatible ontology writer; pause replication before a data migration';
    END IF;
    RETURN NULL;
  END $$`

const ddlGuardV4 = `CREATE OR REPLACE FUNCTION _ontology_replication_guard() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN
    IF (SELECT enabled FROM _ontology_replication WHERE id) AND
       COALESCE(current_setting('segmentstream.writer', true), '') NOT IN ('1', '2') THEN
      RAISE EXCEPTION 'Replication requires a compatible ontology writer; pause replication before a data migration';
    END IF;
    RETURN NULL;
  END $$`

// replicationDDLv3 is REPLICATION_DDL at 0.12.0 with REPLICATION_SCHEMA_VERSION = 3.
var replicationDDLv3 = []string{
	ddlSingleton,
	`INSERT INTO _ontology_replication (id, version) VALUES (true, 3) ON CONFLICT DO NOTHING`,
	`ALTER TABLE _ontology_replication ADD COLUMN IF NOT EXISTS exclusions jsonb NOT NULL DEFAULT '[]'::jsonb`,
	`ALTER TABLE _ontology_replication ADD COLUMN IF NOT EXISTS active_generation uuid`,
	ddlTargets,
	ddlBaselines,
	ddlReceipts,
	ddlGuardV3,
}

// replicationDDLv4 is REPLICATION_DDL at 0.25.0 with REPLICATION_SCHEMA_VERSION = 4.
var replicationDDLv4 = []string{
	ddlSingleton,
	`INSERT INTO _ontology_replication (id, version) VALUES (true, 4) ON CONFLICT DO NOTHING`,
	`ALTER TABLE _ontology_replication ADD COLUMN IF NOT EXISTS exclusions jsonb NOT NULL DEFAULT '[]'::jsonb`,
	`ALTER TABLE _ontology_replication ADD COLUMN IF NOT EXISTS active_generation uuid`,
	ddlTargets,
	`DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
      WHERE conrelid = '_ontology_replication'::regclass AND conname = '_ontology_replication_protocol_floor') THEN
      ALTER TABLE _ontology_replication ADD CONSTRAINT _ontology_replication_protocol_floor
        CHECK (version >= 4) NOT VALID;
    END IF;
  END $$`,
	`CREATE SEQUENCE IF NOT EXISTS _ontology_replication_revision AS bigint CACHE 1`,
	`SELECT setval('_ontology_replication_revision', GREATEST(
    (SELECT revision FROM _ontology_replication WHERE id),
    (SELECT last_value FROM _ontology_replication_revision), 1), true)
    WHERE (SELECT version FROM _ontology_replication WHERE id) < 4`,
	`ALTER TABLE _ontology_replication_targets
    ADD COLUMN IF NOT EXISTS protocol integer NOT NULL DEFAULT 3,
    ADD COLUMN IF NOT EXISTS baseline_complete boolean NOT NULL DEFAULT true,
    ADD COLUMN IF NOT EXISTS baseline_cursor jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN IF NOT EXISTS initial_revision bigint,
    ADD COLUMN IF NOT EXISTS backfill_complete boolean NOT NULL DEFAULT true,
    ADD COLUMN IF NOT EXISTS backfill_cursor jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN IF NOT EXISTS backfill_revision bigint,
    ADD COLUMN IF NOT EXISTS verified_count bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS replay_complete boolean NOT NULL DEFAULT true,
    ADD COLUMN IF NOT EXISTS replay_cursor uuid`,
	`CREATE TABLE IF NOT EXISTS _ontology_replication_delivery (
    generation uuid NOT NULL REFERENCES _ontology_replication_targets(generation),
    event_id uuid NOT NULL, history_table text, revision bigint NOT NULL,
    is_baseline boolean NOT NULL DEFAULT false,
    accepted_at timestamptz, verified_at timestamptz,
    next_verify_at timestamptz NOT NULL DEFAULT now(), last_checked_at timestamptz,
    PRIMARY KEY (generation, event_id)
  )`,
	`CREATE INDEX IF NOT EXISTS _ontology_delivery_pending ON _ontology_replication_delivery
    (generation, revision, event_id) WHERE accepted_at IS NULL`,
	`CREATE INDEX IF NOT EXISTS _ontology_delivery_verify ON _ontology_replication_delivery
    (generation, next_verify_at, event_id) WHERE accepted_at IS NOT NULL AND verified_at IS NULL`,
	`CREATE INDEX IF NOT EXISTS _ontology_delivery_unverified ON _ontology_replication_delivery
    (generation, event_id) WHERE verified_at IS NULL`,
	`CREATE INDEX IF NOT EXISTS _ontology_delivery_initial ON _ontology_replication_delivery
    (generation, revision, event_id) WHERE verified_at IS NULL`,
	`UPDATE _ontology_replication_targets SET backfill_complete = false,
     backfill_revision = (SELECT revision FROM _ontology_replication WHERE id),
     initial_revision = (SELECT revision FROM _ontology_replication WHERE id)
     WHERE protocol = 3 AND backfill_revision IS NULL`,
	ddlBaselines,
	ddlReceipts,
	ddlGuardV4,
}

func qi(name string) string { return pgx.Identifier{name}.Sanitize() }

// ql quotes a literal as the SDK's quoteLiteral does.
func ql(value string) string { return "'" + strings.ReplaceAll(value, "'", "''") + "'" }

// snapshotExpression is the SDK's snapshotExpression (seed 001): the record's
// query fields as jsonb, integers as text, in chunks of 80 arguments.
func snapshotExpression(e Entity, alias string) string {
	var values []string
	for _, f := range e.Fields() {
		cast := ""
		if f.Storage == "integer" {
			cast = "::text"
		}
		values = append(values, ql(f.Name), alias+"."+qi(f.Column)+cast)
	}
	var chunks []string
	for off := 0; off < len(values); off += 80 {
		end := min(off+80, len(values))
		chunks = append(chunks, "jsonb_build_object("+strings.Join(values[off:end], ", ")+")")
	}
	return "(" + strings.Join(chunks, " || ") + ")"
}

// CaptureFunction returns the name of an entity's capture function:
// _replicate_ and the first 40 hex digits of the SHA-256 of its id.
func CaptureFunction(entityID string) string {
	sum := sha256.Sum256([]byte(entityID))
	return "_replicate_" + hex.EncodeToString(sum[:])[:40]
}

// entityDDL is the SDK's replicationEntityDdl for protocol 3 (seed 001) or 4
// (seed 000).
func entityDDL(m Manifest, protocol int) []string {
	var out []string
	for _, e := range m.Entities {
		if !e.Replicated() {
			continue
		}
		history := qi(historyTable(e.Name))
		table := qi(tableName(e.Name))
		key := CaptureFunction(e.ID)[len("_replicate_"):]
		fn := qi("_replicate_" + key)
		var declared []string
		for _, r := range e.Relationships {
			if r.Cardinality == "many" {
				declared = append(declared, r.Name)
			}
		}
		declaredJSON, _ := json.Marshal(append([]string{}, declared...))
		declareExtra, revision, deliver := "", `UPDATE _ontology_replication SET revision = revision + 1 WHERE id RETURNING * INTO state;`, ""
		eventRevision, eventGeneration := "state.revision::text", ""
		if protocol >= 4 {
			declareExtra = "event_revision bigint; "
			revision = `event_revision := nextval('_ontology_replication_revision');`
			eventRevision, eventGeneration = "event_revision::text", " 'generation', state.active_generation::text,"
			deliver = `
        INSERT INTO _ontology_replication_delivery (generation, event_id, history_table, revision)
          VALUES (state.active_generation, NEW.id, TG_TABLE_NAME, event_revision);`
		}
		function := fmt.Sprintf(`CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $$
      DECLARE state _ontology_replication; policy jsonb; snapshot jsonb; relation text; other_id text;
              %srecord_key text; record_kind text := 'entity';
              is_deleted boolean := NEW.kind = 'delete';
      BEGIN
        SELECT * INTO state FROM _ontology_replication WHERE id;
        policy := state.selection->%s;
        IF NOT state.enabled OR policy IS NULL THEN RETURN NEW; END IF;
        record_key := NEW.record_id::text;
        IF NEW.kind IN ('link', 'unlink') THEN
          SELECT key INTO relation FROM jsonb_object_keys(NEW.changes) AS key LIMIT 1;
          IF NOT (%s::jsonb ? relation) OR
             NOT (COALESCE(policy->'relationships', '[]'::jsonb) ? relation) THEN RETURN NEW; END IF;
          other_id := COALESCE(NEW.changes->relation->>'after', NEW.changes->relation->>'before');
          record_key := NEW.record_id::text || ':' || other_id;
          record_kind := 'edge:' || relation;
          is_deleted := NEW.kind = 'unlink';
          snapshot := jsonb_build_object('source_id', NEW.record_id::text, 'target_id', other_id);
        ELSIF is_deleted THEN snapshot := '{}'::jsonb;
        ELSE
          SELECT %s INTO snapshot FROM %s AS record WHERE id = NEW.record_id;
          SELECT COALESCE(jsonb_object_agg(key, value), '{}'::jsonb) INTO snapshot
            FROM jsonb_each(snapshot) WHERE key = 'id' OR (policy->'fields' ? key);
          IF snapshot IS NULL OR snapshot = '{}'::jsonb THEN RAISE EXCEPTION 'Replication snapshot is missing'; END IF;
        END IF;
        IF octet_length(snapshot::text) > 200000 THEN
          RAISE EXCEPTION 'Projected ontology record exceeds the replication size limit';
        END IF;
        %s
        NEW.replication := jsonb_build_object('source_id', state.source_id::text,
          'entity_id', %s, 'record_key', record_key, 'record_kind', record_kind,
          'revision', %s,%s 'deleted', is_deleted,
          'schema_hash', %s, 'payload', snapshot::text);%s
        RETURN NEW;
      END $$`, fn, declareExtra, ql(e.ID), ql(string(declaredJSON)), snapshotExpression(e, "record"), table,
			revision, ql(e.ID), eventRevision, eventGeneration, ql(m.Hash), deliver)
		out = append(out,
			`ALTER TABLE `+history+` ADD COLUMN IF NOT EXISTS replication jsonb`,
			`CREATE INDEX IF NOT EXISTS `+qi("_replication_"+key+"_idx")+` ON `+history+`
        (((replication->>'revision')::bigint)) WHERE replication IS NOT NULL`,
			function,
			`DROP TRIGGER IF EXISTS _ontology_capture ON `+history,
			`CREATE TRIGGER _ontology_capture BEFORE INSERT ON `+history+` FOR EACH ROW EXECUTE FUNCTION `+fn+`()`,
			`DROP TRIGGER IF EXISTS _ontology_writer_guard ON `+table,
			`CREATE TRIGGER _ontology_writer_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON `+table+`
        FOR EACH STATEMENT EXECUTE FUNCTION _ontology_replication_guard()`,
		)
		for _, r := range e.Relationships {
			if r.Cardinality != "many" {
				continue
			}
			join := qi(joinTable(e.Name, r.Name))
			out = append(out,
				`DROP TRIGGER IF EXISTS _ontology_writer_guard ON `+join,
				`CREATE TRIGGER _ontology_writer_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON `+join+`
              FOR EACH STATEMENT EXECUTE FUNCTION _ontology_replication_guard()`)
		}
	}
	return out
}

// storageType is the PostgreSQL column type of a property storage.
func storageType(storage string) string {
	switch storage {
	case "integer":
		return "bigint"
	case "number":
		return "double precision"
	case "boolean":
		return "boolean"
	case "date":
		return "date"
	case "timestamp":
		return "timestamptz"
	case "json":
		return "jsonb"
	default:
		return "text"
	}
}

// businessDDL creates what the SDK's migrations create before replication:
// the catalog table, each entity's table and history table, and join tables.
func businessDDL(m Manifest) []string {
	out := []string{`CREATE TABLE IF NOT EXISTS _ontology (
    "id" boolean PRIMARY KEY DEFAULT true CHECK ("id"), "version" integer NOT NULL, "hash" text NOT NULL,
    "manifest" jsonb NOT NULL, "applied_at" timestamptz NOT NULL DEFAULT now()
  )`}
	for _, e := range m.Entities {
		cols := []string{`"id" uuid PRIMARY KEY DEFAULT gen_random_uuid()`,
			`"created_at" timestamptz NOT NULL DEFAULT now()`, `"updated_at" timestamptz NOT NULL DEFAULT now()`}
		for _, p := range e.Properties {
			cols = append(cols, qi(p.Name)+" "+storageType(p.Type))
		}
		for _, r := range e.Relationships {
			if r.Cardinality == "one" {
				cols = append(cols, qi(r.Name+"_id")+" uuid")
			}
		}
		out = append(out,
			"CREATE TABLE "+qi(tableName(e.Name))+" (\n  "+strings.Join(cols, ",\n  ")+"\n)",
			"CREATE TABLE "+qi(historyTable(e.Name))+` (
  "id" uuid PRIMARY KEY DEFAULT gen_random_uuid(), "record_id" uuid NOT NULL, "kind" text NOT NULL,
  "changes" jsonb NOT NULL DEFAULT '{}'::jsonb, "at" timestamptz NOT NULL DEFAULT clock_timestamp()
)`)
	}
	for _, e := range m.Entities {
		for _, r := range e.Relationships {
			if r.Cardinality != "many" {
				continue
			}
			src, dst := joinColumns(e.Name, r)
			out = append(out, "CREATE TABLE "+qi(joinTable(e.Name, r.Name))+" ("+
				qi(src)+" uuid NOT NULL REFERENCES "+qi(tableName(e.Name))+" ON DELETE CASCADE, "+
				qi(dst)+" uuid NOT NULL REFERENCES "+qi(tableName(r.To))+" ON DELETE CASCADE, "+
				"PRIMARY KEY ("+qi(src)+", "+qi(dst)+"))")
		}
	}
	return out
}
