// Package testbench is the root of everything that serves the tests and
// the local mode and is never deployed: a throwaway PostgreSQL (pgtest),
// SDK-shaped databases (sdkfixture), a BigQuery REST server (bqserver), the
// local warehouse that stands in for BigQuery (localwarehouse), a runtime
// token issuer (tokenissuer), faults on the wire to Pub/Sub and BigQuery
// (faultproxy), one workspace's whole surroundings for the functions
// (pipeline), and the test that keeps all of them out of
// the deployed binaries (deptest).
package testbench
