//go:generate go run ./schemagen -out ../../terraform/modules/workspace/events_schema.json

package event

// Field is one column of the BigQuery events table.
type Field struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Mode string `json:"mode"`
}

// TableSchema is the events table's schema, the SDK's
// REPLICATION_TABLE_SCHEMA (replication/bigquery.js, seed 001): the wire
// event's fields, revision as NUMERIC and payload as JSON. A BigQuery
// subscription with use_table_schema maps each message's JSON fields onto
// it. terraform/ reads the schema file generated from it (go generate).
var TableSchema = []Field{
	{Name: "event_id", Type: "STRING", Mode: "REQUIRED"},
	{Name: "source_id", Type: "STRING", Mode: "REQUIRED"},
	{Name: "generation", Type: "STRING", Mode: "REQUIRED"},
	{Name: "entity_id", Type: "STRING", Mode: "REQUIRED"},
	{Name: "record_key", Type: "STRING", Mode: "REQUIRED"},
	{Name: "record_kind", Type: "STRING", Mode: "REQUIRED"},
	{Name: "schema_hash", Type: "STRING", Mode: "REQUIRED"},
	{Name: "revision", Type: "NUMERIC", Mode: "REQUIRED"},
	{Name: "deleted", Type: "BOOLEAN", Mode: "REQUIRED"},
	{Name: "payload", Type: "JSON", Mode: "REQUIRED"},
}
