package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/segmentstream/ontology-replication/shared/event"
)

// The claim's read of its events: a snapshot taken after the claim locks
// (see Claims in the package doc), keeping only rows still pending and not set aside.

// sqlReadShared is sqlSetTimeouts with the shared lifecycle lock, for the
// claim's second read (see sqlClaimSession).
const sqlReadShared = `SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true),
  pg_advisory_xact_lock_shared(hashtextextended($3, 0))`

// sqlPendingBaselineEvents and sqlPendingHistoryEvents are the per-table reads
// of pendingReplicationEvents (sqlBaselineEvents, sqlHistoryEvents) for the
// claimed rows ($2) that are still pending and not set aside, in a snapshot
// taken after their locks (see above): each claimed row comes back with its
// event, or with NULL when its history (or baseline) row is gone or holds
// no captured event, and whether that row exists. Delivery and
// event rows are found by primary key (see Finding rows by key in the package
// doc); the delivery rows are read in a subquery of their own, so that the
// claim rule (sqlClaimable) applies to them unqualified, as everywhere else.
// %s is the history table's quoted identifier, checked against the
// capture-trigger tables.
var (
	sqlPendingBaselineEvents = `SELECT d.event_id::text, b.event, b.id IS NOT NULL FROM (` + sqlClaimedStillPending + `) d
       LEFT JOIN _ontology_replication_baselines b ON b.generation = $1::uuid AND b.id = d.event_id`
	sqlPendingHistoryEvents = `SELECT d.event_id::text, h.replication, h.id IS NOT NULL FROM (` + sqlClaimedStillPending + `) d
       LEFT JOIN %s h ON h.id = d.event_id`
	sqlClaimedStillPending = `SELECT event_id FROM _ontology_replication_delivery
     WHERE generation = $1::uuid AND event_id = ANY (ARRAY(SELECT unnest($2::uuid[])))
       AND (CASE WHEN accepted_at IS NULL AND ` + sqlClaimable + ` THEN true END)`
)

// readEvents reads the events of claimed rows that are still pending, in
// claim order, in one round trip; events whose table has no capture
// trigger come back set aside, and an event whose row is gone with no raw
// event (present tells a row that is gone from one whose replication is
// NULL). A cached history table that has gone (renamed) is looked up again
// once.
func (s *Store) readEvents(ctx context.Context, conn *pgxpool.Conn, t Target, claimed []candidate) ([]captured, []SetAside, error) {
	for attempt := 0; ; attempt++ {
		items, aside, err := s.readEventsOnce(ctx, conn, t, claimed)
		if err != nil && attempt == 0 && undefinedTable(err) {
			s.forgetCaptureTables()
			continue
		}
		return items, aside, err
	}
}

// eventGroup is the claimed rows of one table: its quoted identifier and
// their history ids.
type eventGroup struct {
	ident string
	ids   []string
}

// groupByTable groups claimed rows by table ("": the baselines), in the
// order first met, each table resolved against the capture tables; a
// table that carries no capture trigger is in unknown, with why.
func (s *Store) groupByTable(ctx context.Context, conn *pgxpool.Conn, claimed []candidate) (map[string]*eventGroup, []string, map[string]error, error) {
	groups := map[string]*eventGroup{}
	var order []string
	unknown := map[string]error{}
	for _, cd := range claimed {
		table := ""
		if cd.table != nil {
			table = *cd.table
		}
		if _, ok := unknown[table]; ok {
			continue
		}
		g, ok := groups[table]
		if !ok {
			g = &eventGroup{}
			if table != "" {
				ident, err := s.historyTable(ctx, conn, table)
				if errors.Is(err, ErrNoCaptureTable) {
					unknown[table] = err
					continue
				}
				if err != nil {
					return nil, nil, nil, err
				}
				g.ident = ident
			}
			groups[table] = g
			order = append(order, table)
		}
		g.ids = append(g.ids, cd.id)
	}
	return groups, order, unknown, nil
}

// readEventsOnce reads the claimed rows' events from their tables in one
// round trip, keeping only rows still pending; rows of a table without a
// capture trigger are set aside (ReasonUnknownTable).
func (s *Store) readEventsOnce(ctx context.Context, conn *pgxpool.Conn, t Target, claimed []candidate) ([]captured, []SetAside, error) {
	groups, order, unknown, err := s.groupByTable(ctx, conn, claimed)
	if err != nil {
		return nil, nil, err
	}
	b := &pgx.Batch{}
	b.Queue(sqlReadShared, ms(s.cfg.StatementTimeout), ms(s.cfg.LockTimeout), LifecycleLock)
	for _, table := range order {
		g := groups[table]
		gl, err := uuids(g.ids)
		if err != nil {
			return nil, nil, err
		}
		query := sqlPendingBaselineEvents
		if table != "" {
			query = fmt.Sprintf(sqlPendingHistoryEvents, g.ident)
		}
		b.Queue(query, t.Generation, gl, s.backoffs)
	}
	var unknownIDs []string
	for _, cd := range claimed {
		if cd.table != nil && unknown[*cd.table] != nil {
			unknownIDs = append(unknownIDs, cd.id)
		}
	}
	if len(unknownIDs) > 0 {
		// Rows of tables without a capture trigger are only checked to be
		// still pending: their table is never read.
		ul, err := uuids(unknownIDs)
		if err != nil {
			return nil, nil, err
		}
		b.Queue(sqlPendingBaselineEvents, t.Generation, ul, s.backoffs)
	}
	results := conn.SendBatch(ctx, b)
	events, pending, present, err := readEventResults(results, len(order)+min(len(unknownIDs), 1))
	if cerr := results.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, nil, err
	}
	items := make([]captured, 0, len(claimed))
	var aside []SetAside
	for _, cd := range claimed {
		if !pending[cd.id] {
			continue
		}
		table := ""
		if cd.table != nil {
			table = *cd.table
		}
		if err := unknown[table]; err != nil {
			aside = append(aside, SetAside{HistoryID: cd.id, HistoryTable: table, EventID: event.ID(t.SourceID, cd.id, t.Generation),
				Reason: ReasonUnknownTable, Cause: err})
			continue
		}
		items = append(items, captured{id: cd.id, table: table, raw: events[cd.id], present: present[cd.id], backoff: cd.backoff})
	}
	return items, aside, nil
}

// readEventResults reads readEventsOnce's pipeline: the timeouts, then
// each read's claimed rows still pending with their events, and whether
// each one's event row exists.
func readEventResults(results pgx.BatchResults, reads int) (events map[string][]byte, pending, present map[string]bool, err error) {
	if _, err := results.Exec(); err != nil {
		return nil, nil, nil, err
	}
	pending, present, events = map[string]bool{}, map[string]bool{}, map[string][]byte{}
	var id string
	var raw []byte
	var found bool
	for range reads {
		rows, err := results.Query()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("read events: %w", err)
		}
		_, err = pgx.ForEachRow(rows, []any{&id, &raw, &found}, func() error {
			pending[id], present[id] = true, found
			if raw != nil {
				events[id] = append([]byte(nil), raw...)
			}
			return nil
		})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("read events: %w", err)
		}
	}
	return events, pending, present, nil
}
