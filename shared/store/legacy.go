package store

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/segmentstream/ontology-replication/shared/event"
)

// The legacy (protocol 3) paths: no delivery queue; pending events are found
// by scanning the baselines and every selected history table minus receipts
// (replicationEventsSql and the store of SDK 0.12, seed 001, kept for
// databases whose singleton version is below 4). The scan grows with
// retained history; protocol 4 exists to avoid it.

// sqlLegacyBaselineEvents and sqlLegacyHistoryEvents are the parts of
// replicationEventsSql (seed 001), joined with UNION ALL. %s is a history
// table's quoted identifier, checked against the capture-trigger tables.
const (
	sqlLegacyBaselineEvents = `SELECT id, event FROM _ontology_replication_baselines WHERE generation = $1::uuid
    AND $2::text IS NOT NULL AND $3::bigint IS NOT NULL`
	sqlLegacyHistoryEvents = `SELECT id, replication AS event FROM %s
      WHERE replication IS NOT NULL AND replication->>'source_id' = $2
      AND (replication->>'revision')::bigint > $3::bigint`
)

// sqlLegacyPending is pendingReplicationEvents of seed 001 over the events
// of legacyEvents (%s). $4 holds back events this Store set aside (see
// legacyAside); it is empty in the SDK's read.
const sqlLegacyPending = `SELECT e.id::text, e.event FROM (%s) e
     WHERE NOT EXISTS (SELECT 1 FROM _ontology_replication_receipts r
       WHERE r.generation = $1::uuid AND r.event_id = e.id) AND e.id <> ALL($4::uuid[])
     ORDER BY (event->>'revision')::bigint, id LIMIT 100`

// sqlLegacyStatus is replicationStatus of seed 001.
const sqlLegacyStatus = `SELECT count(*) AS total, count(r.event_id) AS accepted, count(r.verified_at) AS verified
     FROM (%s) e
     LEFT JOIN _ontology_replication_receipts r ON r.generation = $1::uuid AND r.event_id = e.id`

// sqlLegacyPendingCount adds to the legacy status what an operator needs:
// the events without a receipt. Protocol 3 records no queue time, so the
// oldest pending age is not reported.
const sqlLegacyPendingCount = `SELECT count(*) FROM (%s) e
     WHERE NOT EXISTS (SELECT 1 FROM _ontology_replication_receipts r
       WHERE r.generation = $1::uuid AND r.event_id = e.id)`

// sqlLegacyAcknowledge is acknowledgeReplication of seed 001.
const sqlLegacyAcknowledge = `INSERT INTO _ontology_replication_receipts (generation, event_id)
     SELECT $1::uuid, value::uuid FROM jsonb_array_elements_text($2::jsonb) ON CONFLICT DO NOTHING`

// sqlLegacyUnverified is unverifiedReplicationEvents of seed 001, also
// returning accepted_at (see sqlDueUnverified).
const sqlLegacyUnverified = `SELECT event_id::text AS id, accepted_at FROM _ontology_replication_receipts
     WHERE generation = $1::uuid AND verified_at IS NULL ORDER BY accepted_at, event_id LIMIT 1000`

// sqlLegacyUnverifiedCount counts the accepted, unverified receipts: at
// protocol 3 every one of them is due for a check.
const sqlLegacyUnverifiedCount = `SELECT count(*) FROM _ontology_replication_receipts
     WHERE generation = $1::uuid AND verified_at IS NULL`

// sqlLegacyVerify is verifyReplicationEvents of seed 001.
const sqlLegacyVerify = `UPDATE _ontology_replication_receipts SET verified_at = now()
    WHERE generation = $1::uuid AND event_id IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))`

// sqlLegacyRetry is the legacy branch of retryUnverifiedReplication (seed
// 000): even legacy recovery retries only checked missing IDs, never the
// unchecked backlog. It returns the ids sent back to pending (a RETURNING
// clause the seed's statement does not have).
const sqlLegacyRetry = `DELETE FROM _ontology_replication_receipts WHERE generation = $1::uuid
         AND verified_at IS NULL AND accepted_at < now() - interval '15 minutes'
         AND event_id IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))
       RETURNING event_id::text`

// sqlLegacyReplay is replayReplication of seed 001: every receipt of the
// generation goes, so every event is pending again.
const sqlLegacyReplay = `DELETE FROM _ontology_replication_receipts WHERE generation = $1::uuid`

// legacyEvents builds replicationEventsSql for t: the baselines, then each
// selected entity's history table, found through its capture trigger.
func (s *Store) legacyEvents(ctx context.Context, tx pgx.Tx, t Target) (string, error) {
	parts := []string{sqlLegacyBaselineEvents}
	for _, sel := range t.Selection {
		table, err := s.entityHistoryTable(ctx, tx, sel.EntityID)
		if err != nil {
			return "", err
		}
		ident, err := s.historyTable(ctx, tx, table)
		if err != nil {
			return "", err
		}
		parts = append(parts, fmt.Sprintf(sqlLegacyHistoryEvents, ident))
	}
	return strings.Join(parts, " UNION ALL "), nil
}

func (s *Store) legacyPending(ctx context.Context, tx pgx.Tx, t Target, exclude []string) (Batch, []SetAside, error) {
	items, err := s.legacyCaptured(ctx, tx, t, exclude)
	if err != nil {
		return Batch{}, nil, err
	}
	return bound(t, items, len(items) == event.MaxBatchEvents)
}

// legacyCaptured reads the next pending events of the legacy scan, those
// in exclude left out.
func (s *Store) legacyCaptured(ctx context.Context, tx pgx.Tx, t Target, exclude []string) ([]captured, error) {
	events, err := s.legacyEvents(ctx, tx, t)
	if err != nil {
		return nil, err
	}
	if exclude == nil {
		exclude = []string{}
	}
	rows, err := tx.Query(ctx, fmt.Sprintf(sqlLegacyPending, events), t.Generation, t.SourceID, t.FromRevision, exclude)
	if err != nil {
		return nil, err
	}
	var items []captured
	var it captured
	_, err = pgx.ForEachRow(rows, []any{&it.id, &it.raw}, func() error {
		items = append(items, captured{id: it.id, raw: append([]byte(nil), it.raw...)})
		return nil
	})
	return items, err
}

// legacyAside is where a protocol-3 database's set-aside events are kept:
// that schema has no delivery row to keep them in, so they are skipped by
// this Store only, until their backoff has passed (and forgotten when the
// process ends). At most maxLegacyAside are kept per Store.
type legacyAside struct {
	mu    sync.Mutex
	until map[string]time.Time // history id → end of its backoff
	prior map[string]time.Duration
}

const maxLegacyAside = 10_000

// excluded returns the ids still set aside.
func (a *legacyAside) excluded(now time.Time) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []string
	for id, until := range a.until {
		if now.Before(until) {
			ids = append(ids, id)
		}
	}
	return ids
}

// finishLegacy acknowledges a legacy claim's accepted events (receipts) and
// keeps its set-aside ones in memory.
func (c *Claim) finishLegacy(ctx context.Context, accepted []string, setAside []SetAside) (int64, error) {
	if len(setAside) > 0 {
		a := &c.store.legacyAside
		prior := map[string]time.Duration{}
		a.mu.Lock()
		if a.until == nil {
			a.until, a.prior = map[string]time.Time{}, map[string]time.Duration{}
		}
		now := time.Now()
		for _, x := range setAside {
			prior[x.HistoryID] = a.prior[x.HistoryID]
			if len(a.until) >= maxLegacyAside {
				for id, until := range a.until {
					if !now.Before(until) {
						delete(a.until, id)
						delete(a.prior, id)
					}
				}
				if len(a.until) >= maxLegacyAside {
					break
				}
			}
			d := c.store.nextBackoff(prior[x.HistoryID])
			a.until[x.HistoryID], a.prior[x.HistoryID] = now.Add(d), d
		}
		a.mu.Unlock()
	}
	if len(accepted) == 0 {
		return 0, nil
	}
	if c.conn == nil { // a test's claim of no session
		return c.store.Acknowledge(ctx, c.target, accepted)
	}
	return c.store.acknowledgeOn(ctx, c.conn, c.target, accepted)
}
