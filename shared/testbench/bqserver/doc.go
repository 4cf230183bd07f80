// Package bqserver is a BigQuery REST server for tests and the local mode:
// it answers the calls the real cloud.google.com/go/bigquery client makes to
// run a query and read its rows (jobs.query, then getQueryResults for an
// empty answer or further pages), with rows a Handler computes from the query
// and its named parameters. The client runs unchanged against it through
// option.WithEndpoint and option.WithoutAuthentication, so the product's
// BigQuery code path is exercised, not mocked. It is never deployed.
package bqserver
