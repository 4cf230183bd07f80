package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/segmentstream/ontology-replication/shared/event"
)

// Pending is one pending event, ready to publish.
type Pending struct {
	// HistoryID is the history (or baseline) row id: the delivery row's and
	// the receipt's event_id.
	HistoryID string
	// HistoryTable is the bare name of the history table, "" for a baseline
	// event (and for every event read by the legacy scan).
	HistoryTable string
	// Event is the wire event, with the target's generation and its id.
	Event event.Event
	// JSON is the event's JSON: the Pub/Sub message data.
	JSON []byte
}

// Batch is one byte-bounded batch of pending events in delivery order.
type Batch struct {
	Events []Pending
	// Bytes is the batch's size as the SDK counts it (event.Batch).
	Bytes int
	// Oversize marks a batch holding a single event that is past the SDK's
	// bound even alone; see event.OversizeError.
	Oversize bool
	// More reports whether more pending events followed this batch when it
	// was read.
	More bool
}

// IDs returns the batch's history ids, the ids acknowledgement takes.
func (b Batch) IDs() []string {
	ids := make([]string, len(b.Events))
	for i, e := range b.Events {
		ids[i] = e.HistoryID
	}
	return ids
}

type reference struct {
	id    string
	table *string
}

// sqlPendingReferences is the first statement of pendingReplicationEvents at
// protocol 4 (seed 000): the oldest outstanding references, in revision
// order, from the partial index _ontology_delivery_pending, so the read does
// not grow with retained history.
const sqlPendingReferences = `SELECT event_id::text AS id, history_table FROM _ontology_replication_delivery
       WHERE generation = $1::uuid AND accepted_at IS NULL
       ORDER BY revision, event_id LIMIT 100`

// sqlClaimReferences improves on sqlPendingReferences for concurrent drains:
// the same rows in the same order, locked FOR UPDATE SKIP LOCKED, so that
// concurrent drains of one workspace take disjoint batches without waiting
// on each other; the locks last until the batch is acknowledged or
// released. $2 holds back events the caller cannot publish (none by
// default), so that they do not block the events behind them.
const sqlClaimReferences = `SELECT event_id::text AS id, history_table FROM _ontology_replication_delivery
       WHERE generation = $1::uuid AND accepted_at IS NULL AND event_id <> ALL($2::uuid[])
       ORDER BY revision, event_id LIMIT 100 FOR UPDATE SKIP LOCKED`

// sqlBaselineEventsSeed and sqlHistoryEventsSeed are the per-table reads of
// pendingReplicationEvents (seed 000). %s is a history table's quoted
// identifier, checked against the capture-trigger tables.
const (
	sqlBaselineEventsSeed = `SELECT id::text, event FROM _ontology_replication_baselines
             WHERE generation = $1::uuid AND id IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))`
	sqlHistoryEventsSeed = `SELECT id::text, replication AS event FROM %s
             WHERE $1::uuid IS NOT NULL AND id IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))`
)

// sqlBaselineEvents and sqlHistoryEvents are the seed's reads with the id
// list as a uuid[] parameter instead of a JSON array (see idList): the same
// rows, found by primary key.
const (
	sqlBaselineEvents = `SELECT id::text, event FROM _ontology_replication_baselines
             WHERE generation = $1::uuid AND id = ANY (ARRAY(SELECT unnest($2::uuid[])))`
	sqlHistoryEvents = `SELECT id::text, replication AS event FROM %s
             WHERE $1::uuid IS NOT NULL AND id = ANY (ARRAY(SELECT unnest($2::uuid[])))`
)

// sqlAcknowledgeSeed is acknowledgeReplicationV4 (seed 000), run after
// sqlShareLifecycle in the same transaction: receipt foreign keys touch
// targets after delivery rows, so the shared lock drains acknowledgement
// before migration table locks. Only rows still pending are accepted; a lost
// publish response leaves the same ids pending, producing duplicates only.
const sqlAcknowledgeSeed = `WITH accepted AS (
          UPDATE _ontology_replication_delivery SET accepted_at = now(), next_verify_at = now()
          WHERE generation = $1::uuid AND accepted_at IS NULL
            AND event_id IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))
          RETURNING event_id, accepted_at
        ) INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at)
          SELECT $1::uuid, event_id, accepted_at FROM accepted ON CONFLICT DO NOTHING`

// sqlAcknowledge is sqlAcknowledgeSeed with its state predicate written as
// byKey(accepted_at IS NULL) and its id list as a uuid[] (see idList), so
// that PostgreSQL finds the batch's rows by primary key.
const sqlAcknowledge = `WITH accepted AS (
          UPDATE _ontology_replication_delivery SET accepted_at = now(), next_verify_at = now()
          WHERE generation = $1::uuid AND (CASE WHEN accepted_at IS NULL THEN true END)
            AND event_id = ANY (ARRAY(SELECT unnest($2::uuid[])))
          RETURNING event_id, accepted_at
        ) INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at)
          SELECT $1::uuid, event_id, accepted_at FROM accepted ON CONFLICT DO NOTHING`

// byKey: the seed's statements that update a list of delivery rows (acknowledge,
// verify, retry) also filter on the rows' state, `accepted_at IS NULL` or
// `accepted_at IS NOT NULL AND verified_at IS NULL`, which is the predicate
// of a partial index (_ontology_delivery_pending, _ontology_delivery_verify).
// When the statistics were taken with that index nearly empty (everything
// verified, then a replay made a million events pending, faster than
// autovacuum analyses), PostgreSQL believes the index holds nothing, scans
// all of it and hash-joins the ids: 200 ms for an acknowledgement of 100
// events with 500,000 pending, where finding them by primary key takes 2 ms.
// The store writes the same predicate as (CASE WHEN <predicate> THEN true
// END): true exactly when the predicate is, NULL (not selected) otherwise, and
// not a predicate a partial index can be matched with, so the rows are found
// by the primary key (generation, event_id) whatever the statistics say.
// TestStateUpdatesUsePrimaryKey checks the plans on stale statistics and
// TestStateUpdatesMatchTheSeed the results against the seed's statements.

// sqlBeginClaim sets the claim transaction's timeouts and takes the shared
// lifecycle lock before any delivery row lock, in the order the seed's
// acknowledgement takes them. The idle timeout releases the row locks of a
// drain that died while publishing.
const sqlBeginClaim = `SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true),
  set_config('idle_in_transaction_session_timeout', $3, true), pg_advisory_xact_lock_shared(hashtextextended($4, 0))`

// idList: the seed sends a list of ids as a JSON array and expands it with
// `IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))`. The
// store's own statements take the list as a uuid[] parameter and match it
// with `= ANY (ARRAY(SELECT unnest($2::uuid[])))`: the same rows (set
// membership either way), looked up in the primary key whatever the sizes
// of the list and the table. The planner cannot see the result of the
// ARRAY(SELECT ...) sub-plan, so it always costs a short list of key
// lookups. Given the JSON array it guesses 100 elements and, on a small
// table, hash-joins them to a scan of the whole table (5.5 ms to
// acknowledge 100 events at 20,000 delivery rows, 1.3–1.6 ms by key);
// given the array itself it knows the length and prefers a scan of the
// whole table to 1,000 lookups (verifying 1,000 events at 100,000 rows:
// 38 ms, against 20 ms with this form). The seed's form stays in the *Seed
// constants, which the tests run beside the store's
// (TestStateUpdatesMatchTheSeed, TestEventReadsMatchTheSeed,
// TestStateUpdatesUsePrimaryKey).

// uuids converts ids in their text form to the uuid[] parameter of the
// store's statements, which pgx sends as 16 bytes each.
func uuids(ids []string) ([]pgtype.UUID, error) {
	out := make([]pgtype.UUID, len(ids))
	for i, id := range ids {
		if b, ok := parseCanonicalUUID(id); ok {
			out[i] = pgtype.UUID{Bytes: b, Valid: true}
			continue
		}
		// Upper case and the form without hyphens take pgx's slower
		// parse.
		if err := out[i].Scan(id); err != nil {
			return nil, fmt.Errorf("id %q is not a uuid: %w", id, err)
		}
	}
	return out, nil
}

// parseCanonicalUUID parses PostgreSQL's text form of a uuid (lower-case
// hex, hyphens after 8, 12, 16 and 20 digits), which is how the store reads
// ids, without allocating.
func parseCanonicalUUID(s string) (u [16]byte, ok bool) {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, false
	}
	j := 0
	for i := 0; i < len(s); i += 2 {
		if s[i] == '-' {
			i++
		}
		hi, lo := unhex(s[i]), unhex(s[i+1])
		if hi > 15 || lo > 15 {
			return u, false
		}
		u[j] = hi<<4 | lo
		j++
	}
	return u, true
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	}
	return 255
}

func idsJSON(ids []string) string {
	raw, _ := json.Marshal(ids)
	return string(raw)
}

// PendingEvents reads the next batch of pending events as the SDK's
// pendingReplicationEvents does, without locking anything: at protocol 4
// from the delivery queue, otherwise by the legacy scan. Like the SDK, it
// fails with *event.OversizeError when an event within the batch cannot fit
// even alone; Claim publishes such an event alone instead.
func (s *Store) PendingEvents(ctx context.Context, t Target) (Batch, error) {
	var b Batch
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		if !t.UsesDelivery() {
			b, err = s.legacyPending(ctx, tx, t, strictBound)
			return err
		}
		refs, err := queryReferences(ctx, tx, sqlPendingReferences, t.Generation)
		if err != nil {
			return err
		}
		b, err = s.buildBatch(ctx, tx, t, refs, strictBound)
		return err
	})
	if err != nil {
		return Batch{}, fmt.Errorf("store: read pending events of %s: %w", t.Generation, err)
	}
	return b, nil
}

func queryReferences(ctx context.Context, tx pgx.Tx, query string, args ...any) ([]reference, error) {
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return collectReferences(rows)
}

// collectReferences reads (event_id, history_table) rows.
func collectReferences(rows pgx.Rows) ([]reference, error) {
	refs := make([]reference, 0, event.MaxBatchEvents)
	var r reference
	_, err := pgx.ForEachRow(rows, []any{&r.id, &r.table}, func() error {
		refs = append(refs, r)
		return nil
	})
	return refs, err
}

// buildBatch fetches the referenced events table by table and applies the
// byte bound in reference order.
func (s *Store) buildBatch(ctx context.Context, tx pgx.Tx, t Target, refs []reference, mode boundMode) (Batch, error) {
	groups := map[string][]string{} // "" = baselines
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
	events := make(map[string][]byte, len(refs))
	for _, table := range order {
		query := sqlBaselineEvents
		if table != "" {
			ident, err := s.historyTable(ctx, tx, table)
			if err != nil {
				return Batch{}, err
			}
			query = fmt.Sprintf(sqlHistoryEvents, ident)
		}
		ids, err := uuids(groups[table])
		if err != nil {
			return Batch{}, err
		}
		rows, err := tx.Query(ctx, query, t.Generation, ids)
		if err != nil {
			return Batch{}, fmt.Errorf("read events from %s: %w", cmpOr(table, "baselines"), err)
		}
		var id string
		var raw []byte
		_, err = pgx.ForEachRow(rows, []any{&id, &raw}, func() error {
			if raw != nil {
				events[id] = append([]byte(nil), raw...)
			}
			return nil
		})
		if err != nil {
			return Batch{}, fmt.Errorf("read events from %s: %w", cmpOr(table, "baselines"), err)
		}
	}
	var missing []string
	for _, r := range refs {
		if _, ok := events[r.id]; !ok {
			where := "baselines"
			if r.table != nil {
				where = *r.table
			}
			missing = append(missing, where+"/"+r.id)
		}
	}
	if len(missing) > 0 {
		return Batch{}, fmt.Errorf("%w: %s", ErrMissingHistory, strings.Join(missing, ", "))
	}
	items := make([]captured, len(refs))
	for i, r := range refs {
		items[i] = captured{id: r.id, raw: events[r.id]}
		if r.table != nil {
			items[i].table = *r.table
		}
	}
	return bound(t, items, mode)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

type captured struct {
	id, table string
	raw       []byte
}

type boundMode int

const (
	// strictBound is the SDK's: an event past the bound fails the read.
	strictBound boundMode = iota
	// aloneBound publishes an event past the bound in a batch of its own.
	aloneBound
)

// bound builds wire events in order and stops where the SDK's byte bound
// stops (pendingReplicationEvents).
func bound(t Target, items []captured, mode boundMode) (Batch, error) {
	var b Batch
	var size event.Batch
	for _, it := range items {
		ev, err := event.FromCaptured(it.raw, t.SourceID, it.id, t.Generation)
		if err != nil {
			return Batch{}, err
		}
		js := ev.AppendJSON(make([]byte, 0, len(it.raw)+256))
		p := Pending{HistoryID: it.id, HistoryTable: it.table, Event: ev, JSON: js}
		switch size.Offer(len(js)) {
		case event.Added:
			b.Events = append(b.Events, p)
			continue
		case event.TooLarge:
			if mode == strictBound {
				return Batch{}, &event.OversizeError{HistoryID: it.id, EventID: ev.EventID, Bytes: event.MessageBytes(len(js))}
			}
			if len(b.Events) == 0 {
				b.Events = []Pending{p}
				b.Oversize = true
				b.Bytes = event.BatchOverhead + event.MessageBytes(len(js))
				b.More = len(items) > 1
				return b, nil
			}
		}
		// Full, or too large behind other events: the batch ends here.
		b.Bytes = size.Bytes()
		b.More = true
		return b, nil
	}
	b.Bytes = size.Bytes()
	b.More = len(items) == event.MaxBatchEvents
	return b, nil
}

// Claim is a claimed batch: at protocol 4 its delivery rows stay locked
// (FOR UPDATE SKIP LOCKED, under the shared lifecycle lock) until
// Acknowledge or Release, so concurrent drains take disjoint batches.
type Claim struct {
	Batch
	store  *Store
	target Target
	tx     pgx.Tx // nil on the legacy path, which cannot lock its scan
}

// Claim takes the next batch of pending events for publishing. An event past
// the SDK's bound comes alone, with Oversize set. exclude lists history ids
// to hold back (events the caller found it can never publish). The caller
// must call Acknowledge after the whole batch was published, or Release.
//
// At protocol 4 the claim is a transaction holding the batch's delivery rows
// locked, and a second concurrent Claim skips them; this improves on the
// SDK's unlocked read, after which concurrent drains publish the same events.
// On the legacy path the read is the SDK's scan, unlocked.
func (s *Store) Claim(ctx context.Context, t Target, exclude []string) (*Claim, error) {
	if !t.UsesDelivery() {
		var b Batch
		err := s.inTx(ctx, func(tx pgx.Tx) error {
			var err error
			b, err = s.legacyPending(ctx, tx, t, aloneBound, exclude...)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("store: claim pending events of %s: %w", t.Generation, err)
		}
		return &Claim{Batch: b, store: s, target: t}, nil
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: claim pending events of %s: %w", t.Generation, err)
	}
	b, err := func() (Batch, error) {
		if _, err := tx.Exec(ctx, sqlBeginClaim, ms(s.cfg.StatementTimeout), ms(s.cfg.LockTimeout), ms(s.cfg.ClaimIdleTimeout), LifecycleLock); err != nil {
			return Batch{}, err
		}
		if exclude == nil {
			exclude = []string{}
		}
		refs, err := queryReferences(ctx, tx, sqlClaimReferences, t.Generation, exclude)
		if err != nil {
			return Batch{}, err
		}
		return s.buildBatch(ctx, tx, t, refs, aloneBound)
	}()
	if err != nil || len(b.Events) == 0 {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		if err != nil {
			return nil, fmt.Errorf("store: claim pending events of %s: %w", t.Generation, err)
		}
		return &Claim{Batch: b, store: s, target: t}, nil
	}
	return &Claim{Batch: b, store: s, target: t, tx: tx}, nil
}

// Acknowledge marks the whole claimed batch accepted (delivery rows and
// receipts) and ends the claim. Call it only after Pub/Sub accepted every
// event of the batch. It returns the number of receipts written.
func (c *Claim) Acknowledge(ctx context.Context) (int64, error) {
	return c.AcknowledgeIDs(ctx, c.IDs())
}

// AcknowledgeIDs marks some of the claimed events accepted (history ids of
// events Pub/Sub accepted) and ends the claim; the others stay pending.
func (c *Claim) AcknowledgeIDs(ctx context.Context, ids []string) (int64, error) {
	if c.tx == nil {
		if len(ids) == 0 {
			return 0, nil
		}
		return c.store.Acknowledge(ctx, c.target, ids)
	}
	tx := c.tx
	c.tx = nil
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if len(ids) == 0 {
		return 0, nil
	}
	fail := func(err error) (int64, error) {
		return 0, fmt.Errorf("store: acknowledge %d events of %s: %w", len(ids), c.target.Generation, err)
	}
	list, err := uuids(ids)
	if err != nil {
		return fail(err)
	}
	tag, err := tx.Exec(ctx, sqlAcknowledge, c.target.Generation, list)
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		return fail(err)
	}
	return tag.RowsAffected(), nil
}

// Release ends the claim without acknowledging anything: the events stay
// pending. It is safe to call after Acknowledge, and more than once.
func (c *Claim) Release(ctx context.Context) {
	if c.tx != nil {
		_ = c.tx.Rollback(context.WithoutCancel(ctx))
		c.tx = nil
	}
}

// Acknowledge marks events accepted after Pub/Sub accepted them, as the
// SDK's acknowledgeReplication does: at protocol 4 the delivery rows and
// their receipts, under the shared lifecycle lock; on the legacy path the
// receipts. ids are history ids. It returns the number of receipts written.
func (s *Store) Acknowledge(ctx context.Context, t Target, ids []string) (int64, error) {
	fail := func(err error) (int64, error) {
		return 0, fmt.Errorf("store: acknowledge %d events of %s: %w", len(ids), t.Generation, err)
	}
	delivery := t.DeliveryVersion >= ProtocolDelivery
	query, list := sqlLegacyAcknowledge, any(nil)
	if delivery {
		uu, err := uuids(ids)
		if err != nil {
			return fail(err)
		}
		query, list = sqlAcknowledge, uu
	} else {
		list = idsJSON(ids)
	}
	var n int64
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if delivery {
			if _, err := tx.Exec(ctx, sqlShareLifecycle, LifecycleLock); err != nil {
				return err
			}
		}
		tag, err := tx.Exec(ctx, query, t.Generation, list)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return fail(err)
	}
	return n, nil
}

// ClaimActive reads the replication state and, when replication is enabled
// and has an active target, claims the next batch of its pending events, as
// State, ActiveTarget and Claim would in turn, but in one transaction of
// fewer round trips: the shared lifecycle lock comes first, as in Claim,
// then the state, then the target and the claimed references together. The
// claim is nil when the state says there is nothing to drain (disabled, or
// no active target: the error is ErrNoActiveTarget); on a legacy database it
// falls back to ActiveTarget and Claim.
func (s *Store) ClaimActive(ctx context.Context, exclude []string) (State, Target, *Claim, error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return State{}, Target{}, nil, fmt.Errorf("store: claim pending events: %w", err)
	}
	keep := false
	defer func() {
		if !keep {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	fail := func(err error) (State, Target, *Claim, error) {
		return State{}, Target{}, nil, fmt.Errorf("store: claim pending events: %w", err)
	}
	// The lock first, then the state (the schema check guards the read).
	first := &pgx.Batch{}
	first.Queue(sqlBeginClaim, ms(s.cfg.StatementTimeout), ms(s.cfg.LockTimeout), ms(s.cfg.ClaimIdleTimeout), LifecycleLock)
	first.Queue(sqlSchemaPresent)
	first.Queue(sqlState)
	results := tx.SendBatch(ctx, first)
	if _, err := results.Exec(); err != nil {
		_ = results.Close()
		return fail(err)
	}
	var present bool
	if err := results.QueryRow().Scan(&present); err != nil {
		_ = results.Close()
		return fail(err)
	}
	if !present {
		_ = results.Close() // the state read failed: no table
		return fail(ErrNoSchema)
	}
	st, err := readStateRow(results.QueryRow())
	if cerr := results.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	if st.Version < ProtocolDelivery {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		state, t, err := s.ActiveTarget(ctx)
		if err != nil || !state.Enabled {
			return state, t, nil, err
		}
		c, err := s.Claim(ctx, t, exclude)
		return state, t, c, err
	}
	if st.ActiveGeneration == "" {
		return st, Target{}, nil, fmt.Errorf("store: read active target: %w", ErrNoActiveTarget)
	}
	if exclude == nil {
		exclude = []string{}
	}
	second := &pgx.Batch{}
	second.Queue(sqlTargetV4, st.ActiveGeneration)
	if st.Enabled {
		second.Queue(sqlClaimReferences, st.ActiveGeneration, exclude)
	}
	results = tx.SendBatch(ctx, second)
	t, err := scanTarget(results.QueryRow())
	if err != nil {
		_ = results.Close()
		if err == pgx.ErrNoRows {
			return st, Target{}, nil, fmt.Errorf("store: read active target: %w", ErrNoActiveTarget)
		}
		return fail(err)
	}
	if !st.Enabled {
		_ = results.Close()
		return st, t, nil, nil
	}
	rows, err := results.Query()
	if err != nil {
		_ = results.Close()
		return fail(err)
	}
	refs, err := collectReferences(rows)
	if err != nil {
		_ = results.Close()
		return fail(err)
	}
	if err := results.Close(); err != nil {
		return fail(err)
	}
	b, err := s.buildBatch(ctx, tx, t, refs, aloneBound)
	if err != nil {
		return st, t, nil, fmt.Errorf("store: claim pending events of %s: %w", t.Generation, err)
	}
	if len(b.Events) == 0 {
		return st, t, &Claim{Batch: b, store: s, target: t}, nil
	}
	keep = true
	return st, t, &Claim{Batch: b, store: s, target: t, tx: tx}, nil
}
