// Command local runs the whole replication pipeline on this machine (see
// the README's "Try it") with no cloud account, driven by a workload of SDK
// commits, and prints what happened:
//
//	go run ./job/local [--records N] [--writers N] [--json] [--keep] [--cloud-sql | --pooled]
//
// The parts (a throwaway PostgreSQL with the SDK's schema, an in-process
// Pub/Sub, a local warehouse standing in for BigQuery, the Drain and Verify
// functions on localhost) are the sandbox's: go doc ./shared/testbench/sandbox.
// The chaos proof runs on the same parts: go run ./job/chaos.
//
// Two things are staged: the outage (Pub/Sub refuses publishes for 300 ms)
// and the dead letter (the warehouse refuses one customer's event until
// Pub/Sub dead-letters it). The verifier sends an event back to pending only
// once it was accepted more than 15 minutes ago; so that this happens within
// the demo, the local mode moves that one event's timestamps back 16 minutes
// once it is in the dead letter — the only write it makes behind the
// product's back. The ~30 s to full verification are the verifier's
// 30-second recheck of events it looked for before they landed.
//
// It is a demonstration: it is never deployed, and the deployed job (./job)
// links none of it.
package main
