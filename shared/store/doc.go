// Package store holds every statement this project runs against an ontology
// database: the delivery side of the SDK's replication protocol, version 4
// (the indexed delivery queue) and the legacy version 3 paths.
//
// # Words
//
//   - A history id is the id of the history (or baseline) row that captured
//     a change: the delivery row's and the receipt's event_id. An event id
//     is the wire event's id, hex(sha256("<source>:<history id>:<generation>")),
//     what BigQuery holds.
//   - A target is one generation's row of _ontology_replication_targets; a
//     generation is its id. The active target is the singleton's
//     active_generation.
//   - An event is pending until Pub/Sub accepted it (accepted_at, a receipt),
//     and verified once the verifier saw it in BigQuery (verified_at).
//
// # The event's life
//
// A commit that edits business data writes a history row whose replication
// jsonb holds the event and, at protocol 4, a delivery row with accepted_at
// NULL: the event is pending. A Claim takes the oldest pending events as a
// byte-bounded batch; after Pub/Sub accepted them, Finish acknowledges them
// (accepted, with receipts). ClaimActive claims one batch on a connection
// of its own (a wake-up of the drain function); a Session claims batch
// after batch on one connection, several out at once, its Next
// acknowledging the ended ones and claiming the next in one round trip (a
// bulk drain). DueUnverified lists accepted events to look up
// in BigQuery; Verify marks those found, Retry schedules another look for
// those absent and sends back to pending any accepted more than 15 minutes
// ago. InitReplay and AdvanceReplay send a whole generation back to pending,
// page by page; AdvanceBackfill enqueues the events of a target created
// before protocol 4. An event that cannot be published is set aside: it
// stays pending, and claims skip it until its backoff has passed.
//
//	pending ──Finish──▶ accepted ──Verify──▶ verified
//	  │ ▲                  │                    │
//	  │ └──Retry (>15 min)─┘                    │
//	  │ └──────────────AdvanceReplay────────────┘
//	  └──set aside (backoff)──▶ pending again when it has passed
//
// # Faithful to the SDK
//
// Each statement is a named constant whose comment names the SDK function it
// implements (replication/store.js of SDK 0.12.0 and 0.25.0, in the seeds)
// and does what that statement does: same predicates, order and limits.
// Where this package improves on the SDK it says so in the statement's
// comment, and the tests run the seed's statement (seed_test.go) beside the
// store's and compare what both leave: claims that hold no lock during the
// publish and take disjoint batches (claim.go, session.go), events set
// aside instead of failing the read (setaside.go), an event past the SDK's
// byte bound published alone (batch.go), backfill and replay pages that
// walk the primary key from the cursor (backfill.go, replay.go), id lists
// and state updates found by primary key (ids.go, acknowledge.go).
//
// # Finding rows by key
//
// The seed's statements that update a list of delivery rows (acknowledge,
// verify, retry) filter on the rows' state, accepted_at IS NULL or
// accepted_at IS NOT NULL AND verified_at IS NULL, which is the predicate of
// a partial index (_ontology_delivery_pending, _ontology_delivery_verify).
// When the statistics were taken with that index nearly empty (everything
// verified, then a replay made a million events pending, faster than
// autovacuum analyses), PostgreSQL believes the index holds nothing, scans
// all of it and hash-joins the ids. The store writes the same predicate as
// (CASE WHEN <predicate> THEN true END): true exactly when the predicate
// is, NULL (not selected) otherwise, and not a predicate a partial index can
// be matched with, so the rows are found by the primary key (generation,
// event_id) whatever the statistics say.
//
// The seed sends a list of ids as a JSON array and expands it with IN
// (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb)). The
// store's statements take the list as a uuid[] parameter and match it with
// = ANY (ARRAY(SELECT unnest($2::uuid[]))): the same rows (set membership
// either way), looked up in the primary key whatever the sizes of the list
// and the table. The planner cannot see the length of the ARRAY(SELECT …)
// sub-plan's result, so it always costs a short list of key lookups; given
// the JSON array it guesses 100 elements and, on a small table, hash-joins
// them to a scan of the whole table, and given the bare array it knows the
// length and prefers a scan of the whole table to 1,000 lookups.
// TestStateUpdatesUsePrimaryKey checks the plans and
// TestStateUpdatesMatchTheSeed the results against the seed's statements.
//
// # A good citizen of a shared database
//
// The ontology service shares the Cloud SQL instance and its action
// transactions wait at most 5 s for a lock. So every transaction sets
// statement_timeout and lock_timeout locally (30 s and 5 s by default, as
// the SDK's lifecycle code); no lock an SDK writer or lifecycle operation
// can wait on is held while a batch is published (a claim marks its events
// with session advisory locks of its own, see claim.go); the lifecycle lock
// is taken in the SDK's order (singleton row, then the advisory lock; the
// shared lock before any delivery row or table); statements that update a
// set of delivery rows lock them in key order, so that they wait for each
// other rather than deadlock (sqlSetKeyOrder), and a transaction updates
// its set of delivery rows in one statement (an acknowledgement with
// set-aside events is sqlFinish): two statements, each in key order, are
// not in key order together. Every value is a bind
// parameter. History tables are never derived from names: a delivery row's
// history_table is checked against the tables that carry the SDK's capture
// trigger, and an entity's history table is the one whose trigger runs its
// capture function, so the database role needs no access to business
// tables; a cached table that has gone (renamed) is looked up again.
// Backfill and replay pages vacuum the target table every
// TargetVacuumEvery pages, because each page leaves a version of its
// target row behind.
package store
