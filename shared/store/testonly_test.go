package store

// What only the tests call, kept out of the product: the SDK's own unlocked
// read of the next batch (the oracle the claim is compared with), its
// readiness read, and the claim of a given target with its all-accepted
// finish.

import (
	"time"

	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/segmentstream/ontology-replication/shared/event"
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
			items, err := s.legacyCaptured(ctx, tx, t, nil)
			if err != nil {
				return err
			}
			b, err = strictBound(t, items, len(items) == event.MaxBatchEvents)
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
		b, err = strictBound(t, items, len(refs) == event.MaxBatchEvents)
		return err
	})
	if err != nil {
		return Batch{}, fmt.Errorf("store: read pending events of %s: %w", t.Generation, err)
	}
	return b, nil
}

// strictBound is the SDK's byte bound (pendingReplicationEvents) as the
// SDK applies it: an event whose row is gone or whose capture is not an
// event fails the read, and so does one that cannot fit a request even
// alone; otherwise the batch stops before the event that would pass the
// bound. (The product's bound sets the first two aside and publishes the
// third alone.)
func strictBound(t Target, items []captured, more bool) (Batch, error) {
	var b Batch
	var size event.SizeBound
	for _, it := range items {
		if it.raw == nil {
			return Batch{}, fmt.Errorf("%w: %s/%s", ErrMissingHistory, cmpOr(it.table, "baselines"), it.id)
		}
		js, eventID, err := event.AppendMessage(make([]byte, 0, len(it.raw)+128), it.raw, t.SourceID, it.id, t.Generation)
		if err != nil {
			return Batch{}, err
		}
		switch size.Offer(len(js)) {
		case event.Added:
			b.Events = append(b.Events, Pending{HistoryID: it.id, HistoryTable: it.table, EventID: eventID, JSON: js})
			continue
		case event.TooLarge:
			return Batch{}, &event.OversizeError{HistoryID: it.id, EventID: eventID, Bytes: event.MessageBytes(len(js))}
		}
		b.Bytes, b.More = size.Bytes(), true
		return b, nil
	}
	b.Bytes, b.More = size.Bytes(), more
	return b, nil
}

// InitiallyReady is the SDK's replicationInitiallyReady: baseline, backfill
// and replay complete and no unverified event at or below the fence.
func (s *Store) InitiallyReady(ctx context.Context, t Target) (bool, error) {
	if !t.UsesDelivery() {
		status, err := s.Status(ctx, t)
		return status.InitiallyReady, err
	}
	var ready bool
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, sqlInitiallyReady, t.Generation).Scan(&ready)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrUnknownGeneration
		}
		return err
	})
	if err != nil {
		return false, fmt.Errorf("store: initial readiness of %s: %w", t.Generation, err)
	}
	return ready, nil
}

// Claim claims the next batch of a target's pending events for publishing.
// An event past the SDK's bound comes alone, with Oversize set. The caller
// must call Finish after publishing, or Release.
func (s *Store) Claim(ctx context.Context, t Target) (*Claim, error) {
	if !t.UsesDelivery() {
		// The legacy scan of t, on no session and outside the turns (the
		// product's legacy claims hold the turn: claimLegacy).
		var c *Claim
		err := s.inTx(ctx, func(tx pgx.Tx) error {
			b, aside, err := s.legacyPending(ctx, tx, t, s.legacyAside.excluded(time.Now()))
			c = &Claim{Batch: b, Unpublishable: aside, store: s, target: t, mode: legacyScan}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("store: claim pending events of %s: %w", t.Generation, err)
		}
		return c, nil
	}
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: claim pending events of %s: %w", t.Generation, err)
	}
	c := &Claim{store: s, target: t, conn: conn}
	err = func() error {
		cands, err := c.candidates(ctx, t.Generation, nil)
		if err != nil {
			return err
		}
		return c.fill(ctx, cands)
	}()
	if err != nil {
		c.Release(ctx)
		return nil, fmt.Errorf("store: claim pending events of %s: %w", t.Generation, err)
	}
	return c, nil
}

// Acknowledge finishes a claim whose whole batch Pub/Sub accepted: the
// batch is acknowledged and the claim's Unpublishable events are set aside.
// It returns the number of receipts written.
func (c *Claim) Acknowledge(ctx context.Context) (int64, error) {
	return c.Finish(ctx, c.IDs(), c.Unpublishable)
}

// ClaimInTwoSteps runs a claim's two statements apart: it reads and
// try-locks the first page of candidates now, and returns read, which
// then reads the claimed rows' events as the claim's second statement
// does (the history ids it returns), and release, which ends the claim.
func (s *Store) ClaimInTwoSteps(ctx context.Context, t Target) (read func() ([]string, error), release func(), err error) {
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	c := &Claim{store: s, target: t, conn: conn, locked: true}
	release = func() { c.Release(ctx) }
	cands, err := c.candidates(ctx, t.Generation, nil)
	if err != nil {
		release()
		return nil, nil, err
	}
	var claimed []candidate
	for _, cd := range cands {
		if cd.claimed {
			claimed = append(claimed, cd)
		}
	}
	read = func() ([]string, error) {
		items, _, err := s.readEvents(ctx, conn, t, claimed)
		ids := make([]string, len(items))
		for i, it := range items {
			ids[i] = it.id
		}
		return ids, err
	}
	return read, release, nil
}
