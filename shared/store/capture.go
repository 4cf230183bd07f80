package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// captureTables maps the history tables that carry the SDK's capture trigger.
type captureTables struct {
	byTable    map[string]pgx.Identifier // bare table name (TG_TABLE_NAME) → schema-qualified identifier
	byFunction map[string]string         // capture function name → bare table name
}

// sqlCaptureTables lists the tables with the SDK's _ontology_capture trigger
// and the function each runs. Only tables visible on the search path count:
// the capture trigger records TG_TABLE_NAME, a bare name, which the SDK's
// own statements resolve through the search path.
const sqlCaptureTables = `SELECT n.nspname, c.relname, p.proname
  FROM pg_trigger t
  JOIN pg_class c ON c.oid = t.tgrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_proc p ON p.oid = t.tgfoid
  WHERE t.tgname = '_ontology_capture' AND NOT t.tgisinternal AND pg_table_is_visible(c.oid)`

// querier runs a query: a transaction or a claim's session.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func loadCaptureTables(ctx context.Context, q querier) (*captureTables, error) {
	rows, err := q.Query(ctx, sqlCaptureTables)
	if err != nil {
		return nil, fmt.Errorf("list capture tables: %w", err)
	}
	ct := &captureTables{byTable: map[string]pgx.Identifier{}, byFunction: map[string]string{}}
	var schema, table, function string
	_, err = pgx.ForEachRow(rows, []any{&schema, &table, &function}, func() error {
		ct.byTable[table] = pgx.Identifier{schema, table}
		ct.byFunction[function] = table
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list capture tables: %w", err)
	}
	return ct, nil
}

// captureTables returns the cached capture tables, reloading them when
// refresh is set (a table was not found: a migration may have added it).
func (s *Store) captureTables(ctx context.Context, tx querier, refresh bool) (*captureTables, error) {
	s.mu.Lock()
	ct := s.capture
	s.mu.Unlock()
	if ct != nil && !refresh {
		return ct, nil
	}
	ct, err := loadCaptureTables(ctx, tx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.capture = ct
	s.mu.Unlock()
	return ct, nil
}

// historyTable returns the quoted identifier of a capture table by its bare
// name, checked against the tables that carry the capture trigger.
func (s *Store) historyTable(ctx context.Context, tx querier, name string) (string, error) {
	for _, refresh := range []bool{false, true} {
		ct, err := s.captureTables(ctx, tx, refresh)
		if err != nil {
			return "", err
		}
		if id, ok := ct.byTable[name]; ok {
			return id.Sanitize(), nil
		}
	}
	return "", fmt.Errorf("%w: %q", ErrNoCaptureTable, name)
}

// forgetCaptureTables drops the cached capture tables (a cached table has
// gone: renamed or dropped) and reports whether there was a cache.
func (s *Store) forgetCaptureTables() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	had := s.capture != nil
	s.capture = nil
	return had
}

// CaptureFunction returns the SDK's capture function name for an entity id:
// _replicate_ and the first 40 hex digits of the SHA-256 of the id. The name
// is stable across entity renames (replicationEntityDdl, seed 001).
func CaptureFunction(entityID string) string {
	sum := sha256.Sum256([]byte(entityID))
	return "_replicate_" + hex.EncodeToString(sum[:])[:40]
}

// entityHistoryTable returns the bare name of an entity's history table: the
// table whose capture trigger runs the entity's capture function.
func (s *Store) entityHistoryTable(ctx context.Context, tx querier, entityID string) (string, error) {
	fn := CaptureFunction(entityID)
	for _, refresh := range []bool{false, true} {
		ct, err := s.captureTables(ctx, tx, refresh)
		if err != nil {
			return "", err
		}
		if table, ok := ct.byFunction[fn]; ok {
			return table, nil
		}
	}
	return "", fmt.Errorf("%w: entity %q (capture function %s)", ErrNoCaptureTable, entityID, fn)
}
