package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/segmentstream/ontology-replication/shared/event"
)

// Set-aside events.
//
// An event that cannot be published (its history row is gone, its table has
// no capture trigger, its capture is malformed, or Pub/Sub refuses it) is
// set aside by sqlSetAside: on its pending delivery row, last_checked_at is
// the time it was set aside and next_verify_at that time plus its backoff
// (one of Config's backoffs: 1, 2, 4, … minutes up to an hour by default).
// No seed statement reads either column of a pending row, so the SDK sees
// the event as pending, as it is. Every claim, in every process, skips it
// until next_verify_at; the next claim then takes it with its backoff, and
// a drain that cannot publish it again doubles the backoff. The seed's retry
// (next_verify_at 30 s after last_checked_at), its replay (next_verify_at =
// now()) and an operator's RetrySetAside give a pending row other intervals,
// which mark no set-aside: the event is fresh again. Only the interval is
// kept, so the reason is found again when the set-aside events are listed.

// sqlSetAsideInterval is a delivery row's set-aside interval, as the store
// writes it and compares it with its backoffs: next_verify_at −
// last_checked_at, in whole microseconds. It is the one spelling of the
// set-aside rule: every statement that tells a set-aside row from another
// builds on it (setAsideMarked).
const sqlSetAsideInterval = `(extract(epoch FROM next_verify_at - last_checked_at) * 1000000)::bigint`

// setAsideMarked is the predicate "this delivery row's interval is one of
// the backoffs" (the bigint[] parameter named by backoffs, such as "$2"),
// on a row of _ontology_replication_delivery in scope unqualified.
func setAsideMarked(backoffs string) string {
	return `last_checked_at IS NOT NULL AND ` + sqlSetAsideInterval + ` = ANY (` + backoffs + `::bigint[])`
}

// sqlSetAsideMarked is the set-aside predicate of a delivery row: pending,
// with its interval one of the backoffs ($2).
var sqlSetAsideMarked = `accepted_at IS NULL AND ` + setAsideMarked("$2")

// sqlSetAsideCount and sqlSetAsideList count and list a target's set-aside
// events, from the pending rows (the partial index
// _ontology_delivery_pending), oldest first.
var (
	sqlSetAsideCount = `SELECT count(*) FROM _ontology_replication_delivery WHERE generation = $1::uuid AND ` + sqlSetAsideMarked
	sqlSetAsideList  = `SELECT event_id::text, history_table, last_checked_at, next_verify_at FROM _ontology_replication_delivery
     WHERE generation = $1::uuid AND ` + sqlSetAsideMarked + ` ORDER BY revision, event_id LIMIT $3`
)

// sqlRetrySetAside ends the set-aside of a target's events now (the store's
// own statement): next_verify_at = now() leaves no backoff interval, so the
// next claim takes them as fresh events. The rows are found from the
// pending index and updated by primary key, in key order (see
// sqlSetKeyOrder).
var sqlRetrySetAside = `UPDATE _ontology_replication_delivery SET next_verify_at = now()
     WHERE generation = $1::uuid AND (CASE WHEN ` + sqlSetAsideMarked + ` THEN true END)
       AND event_id = ANY (ARRAY(SELECT event_id FROM _ontology_replication_delivery
                                  WHERE generation = $1::uuid AND ` + sqlSetAsideMarked + `))`

// SetAsideEvent is one set-aside event, as status lists it.
type SetAsideEvent struct {
	HistoryID    string    `json:"history_id"`
	EventID      string    `json:"event_id"`
	HistoryTable string    `json:"history_table,omitempty"`
	Reason       Reason    `json:"reason"`
	Detail       string    `json:"detail,omitempty"`
	Since        time.Time `json:"since"`        // when it was last set aside
	NextAttempt  time.Time `json:"next_attempt"` // when claims take it again
	Attempts     int       `json:"attempts"`     // times set aside in a row
	// Code is the gRPC status code its publishes failed with, for
	// ReasonPublishFailed (else -1).
	Code int `json:"-"`
}

// SetAsideReport is a target's set-aside events.
type SetAsideReport struct {
	// Count is how many events are set aside.
	Count int64 `json:"count"`
	// Events lists the oldest of them (up to the limit asked for).
	Events []SetAsideEvent `json:"events,omitempty"`
	// InThisProcessOnly: at protocol 3 the set-aside events live in the
	// memory of the process that set them aside (the schema has nowhere to
	// keep them), so this report, from another process, cannot see them.
	InThisProcessOnly bool `json:"-"`
}

// ReadSetAside reports a target's set-aside events, at most limit of them
// listed, each with the reason found now: its history row is gone, its
// table has no capture trigger, its capture is malformed, its message is
// larger than maxMessageBytes, every publish of it alone failed
// (ReasonPublishFailed), or else Pub/Sub refused it. The legacy path
// keeps no set-aside in the database and reports none.
func (s *Store) ReadSetAside(ctx context.Context, t Target, limit, maxMessageBytes int) (SetAsideReport, error) {
	var rep SetAsideReport
	if !t.UsesDelivery() {
		rep.InThisProcessOnly = true
		return rep, nil
	}
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, sqlSetAsideCount, t.Generation, s.backoffs).Scan(&rep.Count); err != nil {
			return err
		}
		if rep.Count == 0 || limit <= 0 {
			return nil
		}
		rows, err := tx.Query(ctx, sqlSetAsideList, t.Generation, s.backoffs, limit)
		if err != nil {
			return err
		}
		var ev SetAsideEvent
		var table *string
		_, err = pgx.ForEachRow(rows, []any{&ev.HistoryID, &table, &ev.Since, &ev.NextAttempt}, func() error {
			ev.HistoryTable = ""
			if table != nil {
				ev.HistoryTable = *table
			}
			ev.EventID = event.ID(t.SourceID, ev.HistoryID, t.Generation)
			backoff, tag := splitInterval(ev.NextAttempt.Sub(ev.Since).Microseconds())
			ev.Attempts = s.attempts(backoff)
			ev.Code = int(tag) - 1 // -1: no publish failure kept
			rep.Events = append(rep.Events, ev)
			return nil
		})
		if err != nil {
			return err
		}
		return s.findReasons(ctx, tx, t, rep.Events, maxMessageBytes)
	})
	if err != nil {
		return SetAsideReport{}, fmt.Errorf("store: list set-aside events of %s: %w", t.Generation, err)
	}
	return rep, nil
}

// attempts is how many times in a row an event was set aside, from its
// backoff.
func (s *Store) attempts(backoff time.Duration) int {
	n := 1
	for d := s.cfg.SetAsideBackoff; d < backoff; d = s.nextBackoff(d) {
		n++
		if d == s.cfg.SetAsideMaxBackoff {
			break
		}
	}
	return n
}

// findReasons reads the listed events again to say why each cannot be
// published.
func (s *Store) findReasons(ctx context.Context, tx pgx.Tx, t Target, events []SetAsideEvent, maxMessageBytes int) error {
	byTable := map[string][]int{}
	for i, ev := range events {
		byTable[ev.HistoryTable] = append(byTable[ev.HistoryTable], i)
	}
	for table, at := range byTable {
		query := sqlBaselineEvents
		if table != "" {
			ident, err := s.historyTable(ctx, tx, table)
			if errors.Is(err, ErrNoCaptureTable) {
				for _, i := range at {
					events[i].Reason, events[i].Detail = ReasonUnknownTable, err.Error()
				}
				continue
			}
			if err != nil {
				return err
			}
			query = fmt.Sprintf(sqlHistoryEvents, ident)
		}
		ids := make([]string, len(at))
		for j, i := range at {
			ids[j] = events[i].HistoryID
		}
		list, err := uuids(ids)
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, query, t.Generation, list)
		if err != nil {
			return err
		}
		raw := map[string][]byte{}
		found := map[string]bool{}
		var id string
		var ev []byte
		if _, err := pgx.ForEachRow(rows, []any{&id, &ev}, func() error {
			found[id] = true
			if ev != nil {
				raw[id] = append([]byte(nil), ev...)
			}
			return nil
		}); err != nil {
			return err
		}
		for _, i := range at {
			e := &events[i]
			r, ok := raw[e.HistoryID]
			switch {
			case !ok && found[e.HistoryID]:
				e.Reason, e.Detail = ReasonNotCaptured, "the history row holds no captured event: its replication column is NULL"
				continue
			case !ok:
				e.Reason, e.Detail = ReasonMissingHistory, "the history (or baseline) row is gone"
				continue
			}
			js, _, err := event.AppendMessage(nil, r, t.SourceID, e.HistoryID, t.Generation)
			switch {
			case err != nil:
				e.Reason, e.Detail = ReasonMalformed, err.Error()
			case len(js) > maxMessageBytes:
				e.Reason, e.Detail = ReasonTooLarge, fmt.Sprintf("its message is %d bytes", len(js))
			case e.Code >= 0:
				e.Reason, e.Detail = ReasonPublishFailed, "every publish of it alone failed the same way while Pub/Sub took other events (the drain's error log has the error)"
			default:
				e.Reason, e.Detail = ReasonRejected, "Pub/Sub refused every request holding it (the drain's error log has its answer)"
			}
		}
	}
	return nil
}

// RetrySetAside ends the backoff of every set-aside event of a target, so
// that the next drain tries them again (after their cause was fixed). It
// returns how many there were.
func (s *Store) RetrySetAside(ctx context.Context, t Target) (int64, error) {
	if !t.UsesDelivery() {
		s.legacyAside.mu.Lock()
		n := int64(len(s.legacyAside.until))
		s.legacyAside.until, s.legacyAside.prior = nil, nil
		s.legacyAside.mu.Unlock()
		return n, nil
	}
	var n int64
	err := s.inKeyOrderTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlShareLifecycle, LifecycleLock); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, sqlRetrySetAside, t.Generation, s.backoffs)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("store: retry set-aside events of %s: %w", t.Generation, err)
	}
	return n, nil
}
