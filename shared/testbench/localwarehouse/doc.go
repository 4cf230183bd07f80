// Package localwarehouse is the local mode's stand-in for BigQuery: a
// PostgreSQL database with the events table's columns, fed from a Pub/Sub
// subscription the way a BigQuery subscription with use_table_schema writes
// (rows that do not fit are refused until they are dead-lettered), with the
// same latest-state views as BigQuery's. The product's BigQuery queries
// (the verifier's lookup, the audit's buckets and records) are answered by
// running the SQL the BigQuery client sent, rewritten by a few mechanical
// rules (dialect.go), so that the BigQuery spelling itself is what the
// tests execute. Tests and the local mode use it; it is never deployed.
package localwarehouse
