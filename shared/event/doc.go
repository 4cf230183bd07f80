// Package event defines the replication wire event: its fields, its
// deterministic id, its JSON form and the SDK's publish-size accounting.
//
// # The wire event
//
// Every event the SDK captures is published as one Pub/Sub message whose data
// is the event's JSON and lands as one row of the BigQuery events table. The
// fields and their types are the SDK's ReplicationEvent; revision is a decimal
// string and payload is JSON text.
//
// # Sizes
//
// The SDK bounds a batch by counting each event as the length of
// {"data":"<base64 of its JSON>"} plus 1, starting from 32, and ending the
// batch before 1,000,000 bytes or 100 events. AppendJSON writes the JSON byte
// for byte as JavaScript's JSON.stringify does, so Batch counts exactly what
// the SDK counts.
package event
