package sdkfixture

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Writer commits business changes the way the SDK's writer does: each
// transaction first runs beginReplicationWrite (the shared lifecycle lock and
// segmentstream.writer = '2' at protocol 4; the singleton row lock and '1'
// before), then writes the business rows and one history row per change, on
// which the capture trigger records the event.
type Writer struct {
	db DB
	m  Manifest
	// committed, when set, receives the history ids of each committed
	// transaction (OnCommit).
	committed func(historyIDs []string)
}

// NewWriter returns a writer for manifest m.
func NewWriter(db DB, m Manifest) *Writer { return &Writer{db: db, m: m} }

// OnCommit returns a writer like w that passes fn the ids of the history
// rows (the delivery rows' event_id) each of its transactions wrote, once
// it committed: a test's way to follow its own commits' events.
func (w *Writer) OnCommit(fn func(historyIDs []string)) *Writer {
	c := *w
	c.committed = fn
	return &c
}

// Change writes the changes of one transaction.
type Change struct {
	ctx context.Context
	tx  pgx.Tx
	m   Manifest
	// record: the writer follows its commits (OnCommit); ids are the
	// history rows written.
	record bool
	ids    []string
}

// Commit runs fn in one SDK write transaction and commits it.
func (w *Writer) Commit(ctx context.Context, fn func(c *Change) error) error {
	var ids []string
	err := pgx.BeginFunc(ctx, w.db, func(tx pgx.Tx) error {
		if err := beginReplicationWrite(ctx, tx); err != nil {
			return err
		}
		c := &Change{ctx: ctx, tx: tx, m: w.m, record: w.committed != nil}
		err := fn(c)
		ids = c.ids
		return err
	})
	if err == nil && w.committed != nil {
		w.committed(ids)
	}
	return err
}

// beginReplicationWrite is the SDK's beginReplicationWrite (seed 000).
func beginReplicationWrite(ctx context.Context, tx pgx.Tx) error {
	var present bool
	if err := tx.QueryRow(ctx, "SELECT to_regclass('_ontology_replication') IS NOT NULL AS present").Scan(&present); err != nil {
		return err
	}
	if !present {
		return nil
	}
	var version int
	if err := tx.QueryRow(ctx, "SELECT version FROM _ontology_replication WHERE id").Scan(&version); err != nil {
		return err
	}
	if version < 4 {
		if _, err := tx.Exec(ctx, "SELECT id FROM _ontology_replication WHERE id FOR UPDATE"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "SELECT set_config('segmentstream.writer', '1', true)")
		return err
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))", LifecycleLock); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, "SELECT set_config('segmentstream.writer', '2', true)")
	return err
}

// Create creates a record and returns its id.
func (w *Writer) Create(ctx context.Context, entity string, values map[string]any) (id string, err error) {
	err = w.Commit(ctx, func(c *Change) error { id, err = c.Create(entity, values); return err })
	return id, err
}

// Update updates a record's fields.
func (w *Writer) Update(ctx context.Context, entity, id string, values map[string]any) error {
	return w.Commit(ctx, func(c *Change) error { return c.Update(entity, id, values) })
}

// Delete deletes a record (after unlinking its edges).
func (w *Writer) Delete(ctx context.Context, entity, id string) error {
	return w.Commit(ctx, func(c *Change) error { return c.Delete(entity, id) })
}

// Link links source to target through a many-relationship of entity.
func (w *Writer) Link(ctx context.Context, entity, relationship, source, target string) error {
	return w.Commit(ctx, func(c *Change) error { return c.Link(entity, relationship, source, target) })
}

// Unlink removes a many-relationship edge.
func (w *Writer) Unlink(ctx context.Context, entity, relationship, source, target string) error {
	return w.Commit(ctx, func(c *Change) error { return c.Unlink(entity, relationship, source, target) })
}

// Tx is the write's transaction, for a test that adds statements of its own.
func (c *Change) Tx() pgx.Tx { return c.tx }

func (c *Change) entity(name string) (Entity, error) {
	e, ok := c.m.Entity(name)
	if !ok {
		return Entity{}, fmt.Errorf("sdkfixture: unknown entity %q", name)
	}
	return e, nil
}

func (c *Change) columns(e Entity, values map[string]any) ([]string, []any, error) {
	names := make([]string, 0, len(values))
	for k := range values {
		names = append(names, k)
	}
	slices.Sort(names)
	var args []any
	for _, k := range names {
		if !slices.ContainsFunc(e.Fields(), func(f Field) bool { return f.Column == k }) {
			return nil, nil, fmt.Errorf("sdkfixture: %s has no field %q", e.Name, k)
		}
		args = append(args, values[k])
	}
	return names, args, nil
}

func (c *Change) history(e Entity, recordID, kind string, changes map[string]any) error {
	raw, err := json.Marshal(changes)
	if err != nil {
		return err
	}
	insert := "INSERT INTO " + qi(historyTable(e.Name)) + ` ("record_id", "kind", "changes") VALUES ($1::uuid, $2, $3::jsonb)`
	if c.record {
		var id string
		err = c.tx.QueryRow(c.ctx, insert+" RETURNING id::text", recordID, kind, string(raw)).Scan(&id)
		c.ids = append(c.ids, id)
	} else {
		_, err = c.tx.Exec(c.ctx, insert, recordID, kind, string(raw))
	}
	if err != nil {
		return fmt.Errorf("sdkfixture: %s %s history: %w", kind, e.Name, err)
	}
	return nil
}

func diff(values map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range values {
		out[k] = map[string]any{"before": nil, "after": v}
	}
	return out
}

// Create creates a record and returns its id.
func (c *Change) Create(entity string, values map[string]any) (string, error) {
	e, err := c.entity(entity)
	if err != nil {
		return "", err
	}
	names, args, err := c.columns(e, values)
	if err != nil {
		return "", err
	}
	cols, params := []string{}, []string{}
	for i, n := range names {
		cols = append(cols, qi(n))
		params = append(params, fmt.Sprintf("$%d", i+1))
	}
	stmt := "INSERT INTO " + qi(tableName(e.Name)) + " DEFAULT VALUES RETURNING id::text"
	if len(cols) > 0 {
		stmt = "INSERT INTO " + qi(tableName(e.Name)) + " (" + strings.Join(cols, ", ") + ") VALUES (" + strings.Join(params, ", ") + ") RETURNING id::text"
	}
	var id string
	if err := c.tx.QueryRow(c.ctx, stmt, args...).Scan(&id); err != nil {
		return "", fmt.Errorf("sdkfixture: create %s: %w", e.Name, err)
	}
	return id, c.history(e, id, "create", diff(values))
}

// Update updates a record's fields.
func (c *Change) Update(entity, id string, values map[string]any) error {
	e, err := c.entity(entity)
	if err != nil {
		return err
	}
	names, args, err := c.columns(e, values)
	if err != nil {
		return err
	}
	sets := []string{`"updated_at" = now()`}
	for i, n := range names {
		sets = append(sets, fmt.Sprintf("%s = $%d", qi(n), i+2))
	}
	tag, err := c.tx.Exec(c.ctx, "UPDATE "+qi(tableName(e.Name))+" SET "+strings.Join(sets, ", ")+" WHERE id = $1::uuid", append([]any{id}, args...)...)
	if err != nil {
		return fmt.Errorf("sdkfixture: update %s: %w", e.Name, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("sdkfixture: update %s %s: no such record", e.Name, id)
	}
	return c.history(e, id, "update", diff(values))
}

// Delete unlinks a record's many-relationship edges (both directions), then
// deletes it.
func (c *Change) Delete(entity, id string) error {
	e, err := c.entity(entity)
	if err != nil {
		return err
	}
	for _, owner := range c.m.Entities {
		for _, r := range owner.Relationships {
			if r.Cardinality != "many" || (owner.Name != e.Name && r.To != e.Name) {
				continue
			}
			src, dst := joinColumns(owner.Name, r)
			col := src
			if owner.Name != e.Name {
				col = dst
			}
			rows, err := c.tx.Query(c.ctx, "SELECT "+qi(src)+"::text, "+qi(dst)+"::text FROM "+qi(joinTable(owner.Name, r.Name))+" WHERE "+qi(col)+" = $1::uuid", id)
			if err != nil {
				return err
			}
			edges, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ S, T string }])
			if err != nil {
				return err
			}
			for _, edge := range edges {
				if err := c.Unlink(owner.Name, r.Name, edge.S, edge.T); err != nil {
					return err
				}
			}
		}
	}
	if err := c.history(e, id, "delete", map[string]any{}); err != nil {
		return err
	}
	tag, err := c.tx.Exec(c.ctx, "DELETE FROM "+qi(tableName(e.Name))+" WHERE id = $1::uuid", id)
	if err != nil {
		return fmt.Errorf("sdkfixture: delete %s: %w", e.Name, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("sdkfixture: delete %s %s: no such record", e.Name, id)
	}
	return nil
}

func (c *Change) relationship(entity, name string) (Entity, Relationship, error) {
	e, err := c.entity(entity)
	if err != nil {
		return Entity{}, Relationship{}, err
	}
	for _, r := range e.Relationships {
		if r.Name == name && r.Cardinality == "many" {
			return e, r, nil
		}
	}
	return Entity{}, Relationship{}, fmt.Errorf("sdkfixture: %s has no many-relationship %q", entity, name)
}

// Link links source to target through a many-relationship of entity.
func (c *Change) Link(entity, relationship, source, target string) error {
	e, r, err := c.relationship(entity, relationship)
	if err != nil {
		return err
	}
	src, dst := joinColumns(e.Name, r)
	if _, err := c.tx.Exec(c.ctx, "INSERT INTO "+qi(joinTable(e.Name, r.Name))+" ("+qi(src)+", "+qi(dst)+") VALUES ($1::uuid, $2::uuid)", source, target); err != nil {
		return fmt.Errorf("sdkfixture: link %s.%s: %w", e.Name, r.Name, err)
	}
	return c.history(e, source, "link", map[string]any{r.Name: map[string]any{"before": nil, "after": target}})
}

// Unlink removes a many-relationship edge.
func (c *Change) Unlink(entity, relationship, source, target string) error {
	e, r, err := c.relationship(entity, relationship)
	if err != nil {
		return err
	}
	src, dst := joinColumns(e.Name, r)
	tag, err := c.tx.Exec(c.ctx, "DELETE FROM "+qi(joinTable(e.Name, r.Name))+" WHERE "+qi(src)+" = $1::uuid AND "+qi(dst)+" = $2::uuid", source, target)
	if err != nil {
		return fmt.Errorf("sdkfixture: unlink %s.%s: %w", e.Name, r.Name, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("sdkfixture: unlink %s.%s: no such edge", e.Name, r.Name)
	}
	return c.history(e, source, "unlink", map[string]any{r.Name: map[string]any{"before": target, "after": nil}})
}

// RawHistory writes one history row of a record with the given kind and
// changes, as the SDK's writer would, without touching business rows: for
// the history rows the SDK's capture trigger records oddly (a link whose
// changes name no target captures a null record_key).
func (c *Change) RawHistory(entity, recordID, kind string, changes map[string]any) error {
	e, err := c.entity(entity)
	if err != nil {
		return err
	}
	return c.history(e, recordID, kind, changes)
}
