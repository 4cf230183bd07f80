package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/segmentstream/ontology-replication/shared/event"
)

// sqlBaselineEvents and sqlHistoryEvents are the per-table reads of
// pendingReplicationEvents (seed 000) with the id list as a uuid[] parameter
// instead of a JSON array (see Finding rows by key in the package doc): the
// same rows, found by primary key. %s is a history table's quoted identifier,
// checked against the capture-trigger tables.
const (
	sqlBaselineEvents = `SELECT id::text, event FROM _ontology_replication_baselines
             WHERE generation = $1::uuid AND id = ANY (ARRAY(SELECT unnest($2::uuid[])))`
	sqlHistoryEvents = `SELECT id::text, replication AS event FROM %s
             WHERE $1::uuid IS NOT NULL AND id = ANY (ARRAY(SELECT unnest($2::uuid[])))`
)

// sqlPendingReferences is the first statement of pendingReplicationEvents at
// protocol 4 (seed 000), as the SDK runs it: the oldest outstanding
// references, unlocked (Claim locks its candidates instead).
const sqlPendingReferences = `SELECT event_id::text AS id, history_table FROM _ontology_replication_delivery
       WHERE generation = $1::uuid AND accepted_at IS NULL
       ORDER BY revision, event_id LIMIT 100`

// PendingEvents reads the next batch of pending events as the SDK's
// pendingReplicationEvents does, without locking anything: at protocol 4
// from the delivery queue, otherwise by the legacy scan. Like the SDK, it
// fails when an event within the batch is missing from retained history,
// and with *event.OversizeError when one cannot fit even alone; Claim sets
// the first aside and publishes the second alone instead.
func (s *Store) PendingEvents(ctx context.Context, t Target) (Batch, error) {
	var b Batch
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		if !t.UsesDelivery() {
			b, _, err = s.legacyPending(ctx, tx, t, strictBound, nil)
			return err
		}
		rows, err := tx.Query(ctx, sqlPendingReferences, t.Generation)
		if err != nil {
			return err
		}
		type ref struct {
			id    string
			table *string
		}
		var refs []ref
		var r ref
		if _, err := pgx.ForEachRow(rows, []any{&r.id, &r.table}, func() error { refs = append(refs, r); return nil }); err != nil {
			return err
		}
		groups := map[string][]string{}
		var order []string
		for _, r := range refs {
			key := ""
			if r.table != nil {
				key = *r.table
			}
			if _, ok := groups[key]; !ok {
				order = append(order, key)
			}
			groups[key] = append(groups[key], r.id)
		}
		events := map[string][]byte{}
		for _, table := range order {
			query := sqlBaselineEvents
			if table != "" {
				ident, err := s.historyTable(ctx, tx, table)
				if err != nil {
					return err
				}
				query = fmt.Sprintf(sqlHistoryEvents, ident)
			}
			list, err := uuids(groups[table])
			if err != nil {
				return err
			}
			rows, err := tx.Query(ctx, query, t.Generation, list)
			if err != nil {
				return fmt.Errorf("read events from %s: %w", cmpOr(table, "baselines"), err)
			}
			var id string
			var raw []byte
			if _, err := pgx.ForEachRow(rows, []any{&id, &raw}, func() error {
				if raw != nil {
					events[id] = append([]byte(nil), raw...)
				}
				return nil
			}); err != nil {
				return fmt.Errorf("read events from %s: %w", cmpOr(table, "baselines"), err)
			}
		}
		items := make([]captured, len(refs))
		for i, r := range refs {
			items[i] = captured{id: r.id, raw: events[r.id]}
			if r.table != nil {
				items[i].table = *r.table
			}
		}
		b, _, err = bound(t, items, strictBound, len(refs) == event.MaxBatchEvents)
		return err
	})
	if err != nil {
		return Batch{}, fmt.Errorf("store: read pending events of %s: %w", t.Generation, err)
	}
	return b, nil
}
