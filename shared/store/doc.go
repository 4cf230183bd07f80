// Package store holds every statement this project runs against an ontology
// database: the delivery side of the SDK's replication protocol, version 4
// (the indexed delivery queue) and the legacy version 3 paths.
//
// # The event's life
//
// A commit that edits business data writes a history row whose replication
// jsonb holds the event and, at protocol 4, a delivery row with accepted_at
// NULL: the event is pending. Claim (or PendingEvents) reads the oldest
// pending events as a byte-bounded batch; after Pub/Sub accepted the whole
// batch, Acknowledge marks them accepted and writes receipts. DueUnverified
// lists accepted events to look up in BigQuery; Verify marks those found,
// Retry schedules another look for those absent and sends back to pending
// any accepted more than 15 minutes ago. InitReplay and AdvanceReplay send a
// whole generation back to pending, page by page; AdvanceBackfill enqueues
// the events of a target created before protocol 4.
//
//	pending ──Acknowledge──▶ accepted ──Verify──▶ verified
//	   ▲                        │                    │
//	   └────Retry (>15 min)─────┘                    │
//	   └──────────────AdvanceReplay──────────────────┘
//
// # Faithful to the SDK
//
// Each statement is a named constant whose comment names the SDK function it
// implements (replication/store.js of SDK 0.12.0 and 0.25.0, in the seeds)
// and does what that statement does: same predicates, order, locks and
// limits. Where this package improves on the SDK it says so: Claim locks its
// batch FOR UPDATE SKIP LOCKED so concurrent drains take disjoint batches,
// an event past the SDK's byte bound is published alone instead of failing
// the read (PendingEvents keeps the SDK's behaviour), and a backfill or
// replay page is one statement that walks the primary key from the cursor
// (the seed's page statements are kept beside them, and tests run both and
// compare the databases they leave).
//
// # A good citizen of a shared database
//
// Every transaction sets statement_timeout and lock_timeout locally (30 s and
// 5 s by default, as the SDK's lifecycle code), takes the lifecycle lock in
// the SDK's order, and holds row locks no longer than one batch's publish.
// Every value is a bind parameter. History tables are never derived from
// names: a delivery row's history_table is checked against the tables that
// carry the SDK's capture trigger, and an entity's history table is the one
// whose trigger runs its capture function, so the database role needs no
// access to business tables. Backfill and replay pages vacuum the target
// table every TargetVacuumEvery pages (SKIP_LOCKED, so never waiting on
// autovacuum), because each page leaves a version of its target row behind.
package store
