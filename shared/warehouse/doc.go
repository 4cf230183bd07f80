// Package warehouse is the BigQuery side of delivery: looking accepted events
// up in a workspace's events table (one parameterised query per round of up
// to 1,000 ids, reading only event_id, pruned by generation, event_id and the
// ingestion-time partition) and creating the latest-state views.
package warehouse
