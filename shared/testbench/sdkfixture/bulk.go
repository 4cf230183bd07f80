package sdkfixture

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
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
