package store

import (
	"errors"
	"fmt"
	"time"

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
	// EventID is the wire event id (what BigQuery holds).
	EventID string
	// JSON is the Pub/Sub message data, as the SDK builds it
	// (event.AppendMessage).
	JSON []byte
	// Backoff is how long the event was last set aside for, when it was set
	// aside before and its backoff has passed; 0 for a fresh event.
	Backoff time.Duration
}

// Batch is one byte-bounded batch of pending events in delivery order.
type Batch struct {
	Events []Pending
	// Bytes is the batch's size as the SDK counts it (event.SizeBound).
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

// Reason says why an event was set aside.
type Reason string

// Reasons an event is set aside (see SetAside).
const (
	// ReasonMissingHistory: its history (or baseline) row is gone.
	ReasonMissingHistory Reason = "missing_history"
	// ReasonNotCaptured: its history row is there but holds no captured
	// event (replication is NULL: written past the SDK's capture trigger,
	// or the column cleared). The SDK's pendingReplicationEvents stops on
	// both this and a row that is gone ("missing from retained history");
	// the store sets it aside with the cause that names what happened.
	ReasonNotCaptured Reason = "not_captured"
	// ReasonUnknownTable: its delivery row names a table that carries no
	// capture trigger (a forged or dropped table).
	ReasonUnknownTable Reason = "unknown_table"
	// ReasonMalformed: the captured event is not a JSON object holding the
	// event's keys, so no BigQuery subscription could write it.
	ReasonMalformed Reason = "malformed"
	// ReasonTooLarge: its message is larger than a Pub/Sub request may be.
	ReasonTooLarge Reason = "too_large"
	// ReasonRejected: Pub/Sub refused every request holding it.
	ReasonRejected Reason = "rejected"
	// ReasonPublishFailed: every publish of it alone failed, with one
	// gRPC code (SetAside.Code), while Pub/Sub took other events.
	ReasonPublishFailed Reason = "publish_failed"
)

// SetAside is an event that cannot be published now: the claim's
// Finish sets it aside with a backoff, so that every drain skips it until
// then and the events behind it flow.
type SetAside struct {
	HistoryID    string
	HistoryTable string
	EventID      string
	Reason       Reason
	// Code is the gRPC status code of the failures of an event set aside
	// with ReasonPublishFailed; the set-aside keeps it (see reasonTag).
	Code int
	// Cause is the detail, for the log.
	Cause error
}

type captured struct {
	id, table string
	raw       []byte // nil when the row is gone or holds no event
	present   bool   // the event's row exists (raw nil: replication is NULL)
	backoff   time.Duration
}

// bound builds the messages of captured events in order and stops where
// the SDK's byte bound stops (pendingReplicationEvents). Where the SDK's
// read fails, it goes on: an event whose row is gone or whose capture is
// malformed is set aside and the events behind it go on, and an event past
// the bound comes in a batch of its own. more reports whether items
// followed the last one the batch took or set aside.
func bound(t Target, items []captured, more bool) (Batch, []SetAside, error) {
	var b Batch
	var aside []SetAside
	var size event.SizeBound
	for i, it := range items {
		if it.raw == nil {
			reason, err := ReasonMissingHistory, fmt.Errorf("%w: %s/%s", ErrMissingHistory, cmpOr(it.table, "baselines"), it.id)
			if it.present {
				reason, err = ReasonNotCaptured, fmt.Errorf("%w: %s/%s", ErrNotCaptured, cmpOr(it.table, "baselines"), it.id)
			}
			aside = append(aside, SetAside{HistoryID: it.id, HistoryTable: it.table, EventID: event.ID(t.SourceID, it.id, t.Generation),
				Reason: reason, Cause: err})
			continue
		}
		js, eventID, err := event.AppendMessage(make([]byte, 0, len(it.raw)+128), it.raw, t.SourceID, it.id, t.Generation)
		if err != nil {
			if !errors.Is(err, event.ErrMalformed) {
				return Batch{}, nil, err
			}
			aside = append(aside, SetAside{HistoryID: it.id, HistoryTable: it.table, EventID: eventID, Reason: ReasonMalformed, Cause: err})
			continue
		}
		p := Pending{HistoryID: it.id, HistoryTable: it.table, EventID: eventID, JSON: js, Backoff: it.backoff}
		switch size.Offer(len(js)) {
		case event.Added:
			b.Events = append(b.Events, p)
			continue
		case event.TooLarge:
			if len(b.Events) == 0 {
				b.Events = []Pending{p}
				b.Oversize = true
				b.Bytes = event.BatchOverhead + event.MessageBytes(len(js))
				b.More = more || i+1 < len(items)
				return b, aside, nil
			}
		}
		// Full, or too large behind other events: the batch ends here.
		b.Bytes = size.Bytes()
		b.More = true
		return b, aside, nil
	}
	b.Bytes = size.Bytes()
	b.More = more
	return b, aside, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
