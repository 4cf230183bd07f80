// Package delivery is the one orchestration of replication delivery, called
// by the Drain and Verify functions and by the job alike.
//
// # Drain
//
// Drain publishes at most one batch of a workspace's pending events: in one
// transaction it takes the shared lifecycle lock, reads the replication
// state and claims the oldest pending events (FOR UPDATE SKIP LOCKED, so
// concurrent drains take disjoint batches); it publishes them as one Pub/Sub
// request and acknowledges them only after Pub/Sub accepted the whole batch.
// A failed or timed-out publish acknowledges nothing; a lost response only
// ever yields duplicates. An event Pub/Sub can never take is held back (it
// stays pending and is logged with its ids) without blocking the events
// behind it.
//
// # Verify
//
// Verify repeats "take up to 1,000 due accepted events, one warehouse
// lookup, verify the present, retry the absent" until nothing is due or the
// budget is spent; Sweep then publishes what no wake-up will come for.
// VerifyAll does both for every workspace within one budget, and one
// workspace's failure does not stop the others.
package delivery
