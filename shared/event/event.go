package event

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Event is the wire event published to Pub/Sub and stored as one row of the
// BigQuery events table. Its fields and their JSON types are exactly those of
// the SDK's ReplicationEvent (replication/model.d.ts, seed 001).
type Event struct {
	// EventID is hex(sha256("<source_id>:<history row id>:<generation>")); see ID.
	EventID string
	// SourceID is the replication source (a uuid in PostgreSQL's text form).
	SourceID string
	// Generation is the replication generation; the drain always sets the
	// target's generation, whatever the captured event says.
	Generation string
	// EntityID is the manifest id of the entity the record belongs to.
	EntityID string
	// RecordKey is the record id, or "<source id>:<target id>" for an edge.
	RecordKey string
	// RecordKind is "entity" or "edge:<relationship>".
	RecordKind string
	// Revision is a decimal string, so that a PostgreSQL bigint survives any
	// JSON transport.
	Revision string
	// Deleted marks a tombstone (a deleted record or an unlinked edge).
	Deleted bool
	// SchemaHash is the manifest hash the record was captured under.
	SchemaHash string
	// Payload is the record snapshot as JSON text: Pub/Sub's BigQuery
	// table-schema mode expects a string for a JSON column.
	Payload string
}

// ID returns the event's deterministic id: the lower-case hex SHA-256 of
// "<sourceID>:<historyID>:<generation>" (replicationEventId in seed 001). The
// uuids must be in PostgreSQL's lower-case text form.
func ID(sourceID, historyID, generation string) string {
	sum := sha256.Sum256([]byte(sourceID + ":" + historyID + ":" + generation))
	return hex.EncodeToString(sum[:])
}

// ErrMalformed reports a captured event that is not a JSON object (or not
// JSON): what the SDK's spread would publish is not the captured event.
// Retrying cannot fix it.
var ErrMalformed = errors.New("malformed captured event")

// AppendJSON appends the event's JSON to dst, byte for byte as JavaScript's
// JSON.stringify writes an object with these fields in the BigQuery table's
// order. The drain publishes what AppendMessage builds from the captured
// event instead (the SDK's order and values); this is for tests and tools
// that make wire messages from fields.
func (e *Event) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"event_id":`...)
	dst = AppendString(dst, e.EventID)
	dst = append(dst, `,"source_id":`...)
	dst = AppendString(dst, e.SourceID)
	dst = append(dst, `,"generation":`...)
	dst = AppendString(dst, e.Generation)
	dst = append(dst, `,"entity_id":`...)
	dst = AppendString(dst, e.EntityID)
	dst = append(dst, `,"record_key":`...)
	dst = AppendString(dst, e.RecordKey)
	dst = append(dst, `,"record_kind":`...)
	dst = AppendString(dst, e.RecordKind)
	dst = append(dst, `,"revision":`...)
	dst = AppendString(dst, e.Revision)
	dst = append(dst, `,"deleted":`...)
	dst = strconv.AppendBool(dst, e.Deleted)
	dst = append(dst, `,"schema_hash":`...)
	dst = AppendString(dst, e.SchemaHash)
	dst = append(dst, `,"payload":`...)
	dst = AppendString(dst, e.Payload)
	return append(dst, '}')
}

// MarshalJSON implements json.Marshaler with AppendJSON.
func (e Event) MarshalJSON() ([]byte, error) {
	return e.AppendJSON(nil), nil
}

// UnmarshalJSON implements json.Unmarshaler for the wire form, so that tests,
// the local warehouse and tools can read published messages back.
func (e *Event) UnmarshalJSON(data []byte) error {
	var w struct {
		EventID    string `json:"event_id"`
		SourceID   string `json:"source_id"`
		Generation string `json:"generation"`
		EntityID   string `json:"entity_id"`
		RecordKey  string `json:"record_key"`
		RecordKind string `json:"record_kind"`
		Revision   string `json:"revision"`
		Deleted    bool   `json:"deleted"`
		SchemaHash string `json:"schema_hash"`
		Payload    string `json:"payload"`
	}
	if err := json.Unmarshal(data, &w); err != nil {
		return fmt.Errorf("event: decode wire event: %w", err)
	}
	*e = Event(w)
	return nil
}
