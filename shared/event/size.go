package event

import (
	"encoding/base64"
	"fmt"
)

// The SDK's batch bounds (replication/model.js, seed 001).
const (
	// MaxBatchEvents is the most events one batch holds (REPLICATION_BATCH_SIZE).
	MaxBatchEvents = 100
	// MaxBatchBytes bounds a batch's publish request size as the SDK counts it
	// (REPLICATION_BATCH_BYTES).
	MaxBatchBytes = 1_000_000
	// MaxRecordBytes bounds a projected record when it is captured
	// (REPLICATION_RECORD_BYTES); the capture trigger rejects larger ones.
	MaxRecordBytes = 200_000
	// BatchOverhead is the size a batch starts at before any event.
	BatchOverhead = 32
)

// MessageBytes is what one event adds to a batch's size: the length of
// `{"data":"<base64 of the event JSON>"}` plus 1, where jsonBytes is the
// length of the event's JSON (publishMessage and pendingReplicationEvents in
// the seeds).
func MessageBytes(jsonBytes int) int {
	return len(`{"data":""}`) + base64.StdEncoding.EncodedLen(jsonBytes) + 1
}

// Fit is the outcome of offering an event to a SizeBound.
type Fit int

const (
	// Added means the event was counted in the batch.
	Added Fit = iota
	// Full means the event does not fit after the events already counted: the
	// batch ends before it, and it leads the next one.
	Full
	// TooLarge means the event cannot fit in any batch under the SDK's bound,
	// even alone.
	TooLarge
)

// SizeBound applies the SDK's batch bound to a run of events in delivery
// order: at most MaxBatchEvents events; the size starts at BatchOverhead and
// each event adds MessageBytes; the batch ends before the size would pass
// MaxBatchBytes. It counts sizes only; the zero value counts an empty batch.
type SizeBound struct {
	bytes  int
	events int
}

// Offer counts an event whose JSON is jsonBytes long if it fits.
func (b *SizeBound) Offer(jsonBytes int) Fit {
	n := MessageBytes(jsonBytes)
	switch {
	case n+BatchOverhead > MaxBatchBytes:
		return TooLarge
	case b.events >= MaxBatchEvents || b.Bytes()+n > MaxBatchBytes:
		return Full
	}
	b.bytes += n
	b.events++
	return Added
}

// Bytes is the batch's size as the SDK counts it.
func (b *SizeBound) Bytes() int { return BatchOverhead + b.bytes }

// OversizeError reports an event that cannot fit in a batch under the SDK's
// bound even alone. The SDK fails the whole read on it; this project publishes
// such an event in a batch of its own instead (Pub/Sub takes up to 10 MB a
// request), and reports it with this error wherever it is not allowed.
type OversizeError struct {
	HistoryID string // the history (or baseline) row id
	EventID   string // the wire event id
	Bytes     int    // MessageBytes of the event
}

// Error implements error.
func (e *OversizeError) Error() string {
	return fmt.Sprintf("replication event %s (row %s) needs %d bytes, more than the %d-byte publish bound", e.EventID, e.HistoryID, e.Bytes, MaxBatchBytes)
}
