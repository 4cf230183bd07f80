package localwarehouse

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// Local is the local mode's stand-in for BigQuery: a PostgreSQL database
// holding the events table with the columns of the SDK's table schema,
// written the way a BigQuery subscription with use_table_schema writes
// (message JSON fields onto columns, payload's string into a JSON column,
// revision's string into NUMERIC, unknown fields dropped, a message that
// does not fit refused), with the same latest-state views.
type Local struct {
	pool *pgxpool.Pool
}

// The local events table: the table schema's columns, with PostgreSQL types
// for BigQuery's (STRING text, NUMERIC numeric, BOOLEAN boolean, JSON jsonb)
// and NOT NULL for REQUIRED; ingested_at stands in for BigQuery's ingestion
// time. The functions are SAFE_CAST's: NULL instead of a cast error.
const sqlLocalSchema = `
CREATE TABLE IF NOT EXISTS events (
  event_id text NOT NULL, source_id text NOT NULL, generation text NOT NULL, entity_id text NOT NULL,
  record_key text NOT NULL, record_kind text NOT NULL, schema_hash text NOT NULL,
  revision numeric NOT NULL, deleted boolean NOT NULL, payload jsonb NOT NULL,
  ingested_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS events_lookup ON events (generation, event_id);
CREATE OR REPLACE FUNCTION safe_bigint(v text) RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS
  $$ BEGIN RETURN v::bigint; EXCEPTION WHEN OTHERS THEN RETURN NULL; END $$;
CREATE OR REPLACE FUNCTION safe_float(v text) RETURNS double precision LANGUAGE plpgsql IMMUTABLE AS
  $$ BEGIN RETURN v::double precision; EXCEPTION WHEN OTHERS THEN RETURN NULL; END $$;
CREATE OR REPLACE FUNCTION safe_boolean(v text) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS
  $$ BEGIN RETURN v::boolean; EXCEPTION WHEN OTHERS THEN RETURN NULL; END $$;
CREATE OR REPLACE FUNCTION safe_date(v text) RETURNS date LANGUAGE plpgsql STABLE AS
  $$ BEGIN RETURN v::date; EXCEPTION WHEN OTHERS THEN RETURN NULL; END $$;
CREATE OR REPLACE FUNCTION safe_timestamp(v text) RETURNS timestamptz LANGUAGE plpgsql STABLE AS
  $$ BEGIN RETURN v::timestamptz; EXCEPTION WHEN OTHERS THEN RETURN NULL; END $$;`

// Open prepares the local warehouse in the database at url.
func Open(ctx context.Context, url string) (*Local, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("localwarehouse: %w", err)
	}
	if _, err := pool.Exec(ctx, sqlLocalSchema+sqlDialectFunctions); err != nil {
		pool.Close()
		return nil, fmt.Errorf("localwarehouse: create the events table: %w", err)
	}
	return &Local{pool: pool}, nil
}

// Close closes the warehouse's pool.
func (l *Local) Close() { l.pool.Close() }

// ErrRejected: a message does not fit the table schema. A BigQuery
// subscription retries such a message and then dead-letters it.
var ErrRejected = errors.New("message does not fit the table schema")

// row is one events row decoded from a message.
type row struct {
	values map[string]any
}

// decode maps a message's JSON onto the table schema the way a BigQuery
// subscription with use_table_schema and drop_unknown_fields does: every
// REQUIRED field present and of its type (STRING a JSON string, NUMERIC a
// decimal string or number, BOOLEAN a JSON boolean, JSON a string holding
// JSON), fields the table lacks dropped.
func decode(data []byte) (row, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var msg map[string]any
	if err := dec.Decode(&msg); err != nil {
		return row{}, fmt.Errorf("%w: not a JSON object: %v", ErrRejected, err)
	}
	out := row{values: map[string]any{}}
	for _, f := range event.TableSchema {
		v, ok := msg[f.Name]
		if !ok || v == nil {
			if f.Mode == "REQUIRED" {
				return row{}, fmt.Errorf("%w: required field %s is missing", ErrRejected, f.Name)
			}
			continue
		}
		switch f.Type {
		case "STRING":
			s, ok := v.(string)
			if !ok {
				return row{}, fmt.Errorf("%w: %s is not a string", ErrRejected, f.Name)
			}
			out.values[f.Name] = s
		case "NUMERIC":
			var text string
			switch n := v.(type) {
			case string:
				text = n
			case json.Number:
				text = n.String()
			default:
				return row{}, fmt.Errorf("%w: %s is not a number", ErrRejected, f.Name)
			}
			if _, ok := new(big.Rat).SetString(text); !ok {
				return row{}, fmt.Errorf("%w: %s %q is not a number", ErrRejected, f.Name, text)
			}
			out.values[f.Name] = text
		case "BOOLEAN":
			b, ok := v.(bool)
			if !ok {
				return row{}, fmt.Errorf("%w: %s is not a boolean", ErrRejected, f.Name)
			}
			out.values[f.Name] = b
		case "JSON":
			s, ok := v.(string)
			if !ok || !json.Valid([]byte(s)) {
				return row{}, fmt.Errorf("%w: %s is not a string holding JSON", ErrRejected, f.Name)
			}
			out.values[f.Name] = s
		}
	}
	return out, nil
}

// sqlLocalInsert writes one decoded message.
const sqlLocalInsert = `INSERT INTO events (event_id, source_id, generation, entity_id, record_key, record_kind, schema_hash, revision, deleted, payload)
  VALUES ($1, $2, $3, $4, $5, $6, $7, $8::numeric, $9, $10::jsonb)`

// Ingest writes messages as a BigQuery subscription would, all or none. It
// returns ErrRejected (wrapped, naming the message) for the first message
// that does not fit; nothing is written then.
func (l *Local) Ingest(ctx context.Context, messages [][]byte) error {
	rows := make([]row, len(messages))
	for i, m := range messages {
		r, err := decode(m)
		if err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
		rows[i] = r
	}
	batch := &pgx.Batch{}
	for _, r := range rows {
		v := r.values
		batch.Queue(sqlLocalInsert, v["event_id"], v["source_id"], v["generation"], v["entity_id"], v["record_key"],
			v["record_kind"], v["schema_hash"], v["revision"], v["deleted"], v["payload"])
	}
	return pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		return tx.SendBatch(ctx, batch).Close()
	})
}

// QueryHandler answers the product's BigQuery queries, the verifier's
// lookup (ids) and the audit's (digits), by running their SQL on the local
// table (see dialect.go), so that the real BigQuery client path runs
// against a bqserver backed by it. Other queries (view DDL) are accepted
// and answered with no rows: the local views are PostgreSQL views created
// by CreateViews.
func (l *Local) QueryHandler() bqserver.Handler {
	return func(ctx context.Context, q bqserver.Query) (bqserver.Result, error) {
		_, audit := q.Params["digits"]
		_, lookup := q.Params["ids"]
		if !audit && !lookup {
			return bqserver.Result{Columns: []string{"event_id"}}, nil
		}
		return l.runBigQuery(ctx, q)
	}
}

var postgresCasts = map[string]string{
	"integer": "safe_bigint", "number": "safe_float", "boolean": "safe_boolean", "date": "safe_date", "timestamp": "safe_timestamp",
}

func pgLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// PostgreSQL renders the view's query for the local warehouse: the same
// ranking, tombstones and typed columns as the BigQuery view, in
// PostgreSQL's JSON operators and safe_* casts.
func PostgreSQL(v warehouse.ViewSpec, t warehouse.ViewTarget) string {
	var columns []string
	for _, c := range v.Columns {
		value := "payload->>" + pgLiteral(c.Name)
		if c.Storage == "json" && v.Kind == "entity" {
			value = "payload->" + pgLiteral(c.Name)
		} else if fn, ok := postgresCasts[c.Storage]; ok && v.Kind == "entity" {
			value = fn + "(" + value + ")"
		}
		columns = append(columns, value+" AS "+pgx.Identifier{c.Name}.Sanitize())
	}
	return `SELECT ` + strings.Join(columns, ", ") + ` FROM (
      SELECT *, row_number() OVER (PARTITION BY record_key ORDER BY revision DESC, event_id DESC) AS position
      FROM events
      WHERE generation = ` + pgLiteral(t.Generation) + ` AND source_id = ` + pgLiteral(t.SourceID) + `
        AND entity_id = ` + pgLiteral(v.EntityID) + ` AND record_kind = ` + pgLiteral(v.Kind) + `
    ) latest WHERE position = 1 AND NOT deleted`
}

// CreateViews creates or replaces the target's latest-state views in the
// local warehouse and returns their names: the local mode's
// delivery.ViewCreator, as the BigQuery warehouse is production's.
func (l *Local) CreateViews(ctx context.Context, _ registry.Workspace, t warehouse.ViewTarget) ([]string, error) {
	specs, err := warehouse.ViewSpecs(t)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, s := range specs {
		if _, err := l.pool.Exec(ctx, "DROP VIEW IF EXISTS "+pgx.Identifier{s.Name}.Sanitize()); err != nil {
			return names, err
		}
		if _, err := l.pool.Exec(ctx, "CREATE VIEW "+pgx.Identifier{s.Name}.Sanitize()+" AS "+PostgreSQL(s, t)); err != nil {
			return names, fmt.Errorf("localwarehouse view %s: %w", s.Name, err)
		}
		names = append(names, s.Name)
	}
	return names, nil
}

// Pool is the warehouse's connection pool, for reading its tables and views.
func (l *Local) Pool() *pgxpool.Pool { return l.pool }

// ViewKeys returns the record keys a local view holds: each entity row's id,
// or each edge's "<source_id>:<target_id>".
func (l *Local) ViewKeys(ctx context.Context, spec warehouse.ViewSpec) (map[string]bool, error) {
	query := `SELECT id FROM ` + pgx.Identifier{spec.Name}.Sanitize()
	if spec.Kind != "entity" {
		query = `SELECT source_id || ':' || target_id FROM ` + pgx.Identifier{spec.Name}.Sanitize()
	}
	rows, err := l.pool.Query(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("localwarehouse view %s: %w", spec.Name, err)
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

// ViewValues returns an entity view's rows: each record's id and its
// columns (in the view's order) as a JSON array, in PostgreSQL's jsonb
// text, to compare with the source's (sdkfixture.RecordValues).
func (l *Local) ViewValues(ctx context.Context, spec warehouse.ViewSpec) (map[string]string, error) {
	cols := make([]string, len(spec.Columns))
	for i, c := range spec.Columns {
		cols[i] = pgx.Identifier{c.Name}.Sanitize()
	}
	rows, err := l.pool.Query(ctx, `SELECT id, jsonb_build_array(`+strings.Join(cols, ", ")+`)::text FROM `+pgx.Identifier{spec.Name}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("localwarehouse view %s: %w", spec.Name, err)
	}
	out := map[string]string{}
	var id, values string
	_, err = pgx.ForEachRow(rows, []any{&id, &values}, func() error {
		out[id] = values
		return nil
	})
	return out, err
}

// sqlLocalCounts counts the table's rows and distinct events.
const sqlLocalCounts = `SELECT count(*), count(DISTINCT event_id) FROM events`

// Counts returns how many rows landed and how many distinct events they are.
func (l *Local) Counts(ctx context.Context) (rows, distinct int64, err error) {
	err = l.pool.QueryRow(ctx, sqlLocalCounts).Scan(&rows, &distinct)
	return rows, distinct, err
}

// EventIDs returns the distinct event ids that landed.
func (l *Local) EventIDs(ctx context.Context) (map[string]bool, error) {
	rows, err := l.pool.Query(ctx, `SELECT DISTINCT event_id::text FROM events`)
	if err != nil {
		return nil, fmt.Errorf("localwarehouse: event ids: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("localwarehouse: event ids: %w", err)
	}
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out, nil
}
