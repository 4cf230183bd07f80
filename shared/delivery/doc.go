// Package delivery is the one orchestration of replication delivery, called
// by the Drain and Verify functions and by the job alike.
//
// # Drain
//
// Drain is a wake-up of a workspace's drain, which the ontology service
// sends after every commit. A workspace's wake-ups coalesce through its
// database, whichever instance they reach (store.TakeTurn): one drain holds
// the turn; one waits for it, holding the next turn; a wake-up that finds
// both held leaves its commit to the waiting drain, which has not claimed
// yet, and returns at once (Coalesced), after one statement or, when the
// waiting drain is in the same process, none. On a busy workspace the drain
// that claims next waits Config.Gather first, so that one batch takes the
// commits of several wake-ups. A drain whose turn it is claims the oldest
// pending events (disjoint from other claims, holding no lock the SDK
// waits on; see the store's claims), publishes them as one Pub/Sub request
// and acknowledges them only after Pub/Sub accepted them, and goes on while
// more are pending, for up to Config.DrainFor. A
// failed or timed-out publish acknowledges nothing; a lost response only
// ever yields duplicates. Events that cannot be published are set aside
// with a backoff, and the events behind them go on: those the store found
// unpublishable (missing history row, table without a capture trigger,
// malformed capture), those larger than a request may be, and those Pub/Sub
// refuses, found by bisection of the refused request. Events set aside
// before, whose backoff has passed, go in a request of their own. Each
// drain that sets events aside logs one error line naming them.
//
// DrainAll publishes a workspace's pending events until nothing
// publishable is left, with several batches out at once, all claimed and
// acknowledged on one store.Session: one round trip acknowledges the
// batches whose publishes have ended and claims the next, so that a bulk
// drain holds one connection and its batches never contend for the same
// events. Backfill and Replay are page loops that take turns with their
// drain (every DrainEveryPages pages, and at the end), so that the
// database never runs a page and a claim at once. ForEach walks many
// workspaces a bounded number at a time, carrying on past failures.
//
// # Verify
//
// Verify repeats "take up to 1,000 due accepted events, one warehouse
// lookup, verify the present, retry the absent" until nothing is due or the
// budget is spent; Sweep then publishes what no wake-up will come for.
// VerifyAll does both for every workspace within one budget, and one
// workspace's failure does not stop the others. DeadLetters reads a
// workspace's dead-letter subscription and republishes its messages.
//
// # Connections
//
// A Service leases each workspace's store from its database.Pools for the
// length of an operation (Lease); the pools bound the connections per
// workspace, per PostgreSQL server and how many workspaces are open at
// once, and close what is idle. Long work holds a workspace's pool for its
// whole length (Service.ForEach, DrainAll, a verify pass's units), so that
// no connection is opened per batch or page where pools close when idle
// (the job's).
//
// # Transient faults
//
// DrainAll, Backfill and Replay retry a drain session or a page that meets
// a transient fault (Transient) under the Service's RetryPolicy, with
// backoff, logging each retry at WARNING; acknowledged work is never re-run
// (a session's batches out are finished with what Pub/Sub accepted, the
// rest released, and a new session claims what is still pending). The
// drain function does not retry inside a request.
package delivery
