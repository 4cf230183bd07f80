// Package pgtest gives tests, benchmarks and the local mode a real
// PostgreSQL server.
//
// # The cluster
//
// Start uses $DATABASE_URL's server when that is set. Otherwise it starts a
// throwaway cluster from the installed PostgreSQL binaries: initdb in a
// temporary directory, the server on a free loopback port, run as the postgres
// user when the process is root (PostgreSQL refuses to run as root). The
// server is set up for speed, not durability, and is killed if the process
// that started it dies; Stop shuts it down and removes its files.
//
// # In tests
//
// A test binary calls Main from TestMain; NewDatabase then gives each test a
// fresh database copied from a Template built once per binary, and drops it
// when the test ends:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		url := pgtest.NewDatabase(t, &sdkfixture.V4Template)
//		...
//	}
//
// It serves tests, benchmarks and the local mode, and is never deployed.
package pgtest
