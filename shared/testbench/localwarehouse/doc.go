// Package localwarehouse is the local mode's stand-in for BigQuery: a
// PostgreSQL database with the events table's columns, fed from a Pub/Sub
// subscription the way a BigQuery subscription with use_table_schema writes
// (rows that do not fit are refused until they are dead-lettered), with the
// same latest-state views as BigQuery's. Tests and the local mode use it;
// it is never deployed.
package localwarehouse
