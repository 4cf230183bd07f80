// Package delivery is the one orchestration of replication delivery, called
// by the Drain and Verify functions and by the job alike.
//
// # Drain
//
// Drain is a wake-up of a workspace's drain, which the ontology service
// sends after every commit. On a busy workspace its wake-ups coalesce: in
// each process one is the pending drain, which meets the other processes'
// drains at the workspace's database (store.QueueTurn): one drain holds the
// turn, one holds the next turn, and the others wait in the server for the
// next turn. A wake-up that finds its process's pending drain leaves its
// commit to it, which has not claimed yet, and returns at once (Coalesced)
// without a statement. The drain that holds the next turn waits
// Config.Gather first, so that one batch takes the commits of many
// wake-ups, and then claims: its claim waits in the server for the turn,
// if the drain ahead of it still holds it. A drain whose turn it is claims
// the oldest pending events (disjoint from other claims, holding no lock
// the SDK waits on; see the store's claims), publishes them as one Pub/Sub
// request and acknowledges them only after Pub/Sub accepted them. A failed
// or timed-out publish acknowledges nothing; a lost response only ever
// yields duplicates. Events that cannot be published are set aside with a
// backoff, and the events behind them go on: those the store found
// unpublishable (missing history row, table without a capture trigger,
// malformed capture), those larger than a request may be, and those Pub/Sub
// refuses, found by bisection of the refused request. Events set aside
// before, whose backoff has passed, go in a request of their own. Each
// drain that sets events aside logs one error line naming them.
//
// # A wake-up's word
//
// The SDK wakes the drain once per commit and never retries; it gives the
// request 5 s and only logs a non-2xx (as deferred). So a wake-up answered
// 2xx is a promise: its commit is published by a drain in flight, never
// left to a later wake-up or the verifier's sweep. Cloud Run gives a
// request CPU only while it is served, so what carries a commit is always
// a request in flight: the drain of the wake-up itself, or the pending
// drain it was coalesced into, which claims after it. The structure keeps
// the promise, whatever that drain meets:
//
//   - A drain goes on while its last claim left more pending (its claim
//     read after every commit coalesced into it, oldest first, a batch at a
//     time). It stops only when a claim left nothing and found nothing
//     held by other claims, or by handing what is left to a drain that
//     claims after it: its process's pending drain
//     (HandedOver), which claims when this drain's turn ends; or, once
//     Config.DrainFor has passed since its own first claim, a drain that has
//     claimed since (it queues for the next turn and finds the turn held:
//     that drain's claim read after this one's), unless wake-ups were
//     coalesced into it meanwhile. A drain never leaves its commits to a
//     drain it has not seen claim: one that holds the next turn may be
//     frozen.
//   - Nor to a claim that holds them: its session may be ending (closed
//     by a client that gave up, its locks not yet let go), its instance
//     frozen (the server ends it after its idle timeout), or it may let
//     them go unpublished. A claim that found pending events held by other
//     claims (store.Claim.Held) and took nothing is followed, after a
//     backoff (100 ms, doubling to 2 s), by another, until none is held or
//     Config.RequeueFor has passed since the drain's start (then a warning,
//     LogDrainLeavesHeld, and the drain ends). Drains that take turns never
//     hold each other's events (a claim holds the turn); the claims that
//     can are a quiet workspace's, the sweep's, a probe's and the
//     operations'.
//   - A drain that meets a transient fault (its wait for a turn past
//     Config.TurnWait, its session ended, the SDK's lifecycle lock held by
//     a migration past the lock timeout, Pub/Sub unavailable or slow past
//     its time-out) queues again from its process's pending place after a
//     backoff (100 ms, doubling to 2 s; Requeued, and a warning with the
//     cause), or hands over to the pending drain there is, for up to
//     Config.RequeueFor from its start and within its request's deadline.
//     Meanwhile a wake-up coalesced into it is answered ErrDrainRetrying
//     (503): its commit is left to the drain, which may well publish it,
//     but no promise is made on a drain that is failing.
//   - A drain that freezes while it holds a turn (its instance stopped or
//     cut off) is ended by the server after store.Config.TurnIdleTimeout
//     (15 s), shorter than TurnWait, so the drains queued behind it take
//     the turn within their bound; one killed while it waits in the server
//     is noticed within a second (see the store's Turns).
//   - Whatever the drain cannot outlive leaves events pending, never
//     acknowledged: Pub/Sub down past its 25 s; its own instance frozen or
//     killed after answering coalesced wake-ups; or another instance frozen
//     while its claim holds the commit for longer than this drain may wait
//     (a claim outside the turns sets an idle timeout of a minute). The next wake-up's
//     drain, which claims the oldest pending first, or the verifier's sweep
//     publishes them. The chaos proof (`go run ./job/local --chaos`) measures how
//     many events only the sweep delivered.
//
// At protocol 3 a drain holds the turn from its scan to its end (the
// store's legacy claims), so no two drains publish the same events.
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
// rest released, and a new session claims what is still pending). A
// wake-up's drain on a busy workspace queues again after a transient fault
// within its request (see A wake-up's word); a quiet wake-up's drain, which
// no other wake-up counts on, does not retry: its 503 leaves its commit to
// the next wake-up or the sweep.
//
// # Audit and repair
//
//   - What is compared. A generation's events are the seed's own
//     (`replicationEventsSql`): its baselines and the captured history rows of
//     its source after its `from_revision`. A record's latest state is its
//     event of the highest revision, on both sides written as one number,
//     revision × 2 + deleted; the warehouse's is computed from the events
//     table as the views rank rows. A difference is `missing` (the source has
//     the record, the view does not show it), `stale` (the view shows an older
//     state), `deleted_at_source` (the view still shows a record the source
//     deleted: its tombstone did not land or was lost), `absent_at_source`
//     (the view shows a record the source has no event of: never had, or its
//     history is gone) or `newer_than_source`. Payloads are not compared: an
//     event's payload is fixed by its history row, and its revision names it.
//   - Bounded cost. Each side sums first: per bucket of records (the first 1–3
//     hex digits of `md5(record_key)`, about √n buckets for n records) a count
//     and the XOR of the records' hashes (`md5(record_key || ':' || latest
//     state)`, 60 bits), each side in its own SQL. Only the buckets that
//     differ are read record by record. A clean audit moves at most 4,096
//     bucket figures per view from each side, whatever the table size.
//   - Safe beside live writes. The audit fixes a watermark when it starts (the
//     revision sequence's value; at protocol 3 the singleton's counter) and
//     judges both sides as of it. Because `nextval` is not transactional, a
//     writer may hold a revision below the watermark and commit later; so the
//     audit first waits (up to a minute, then fails naming the backends) until
//     every transaction that was open in the database when the mark was read
//     and writes (an SDK write holding the lifecycle lock, or any transaction
//     with an id) has ended, as `CREATE INDEX CONCURRENTLY` waits: every event
//     at or below the watermark is then visible to the source's pages. A
//     record whose latest event is not yet verified, or was verified after the
//     warehouse's records were read, is *in flight* (counted, not judged): the
//     drain and the verifier are on it. What differs is judged a second time
//     after `--recheck-after` (30 s; 0 turns it off), from a new read of both
//     sides for those records only, and only what that second look confirms is
//     reported (`rechecked` counts what it looked at again). The source is
//     read in pages (below), each page one statement of its own transaction
//     with the store's statement and lock timeouts, taking no lock beyond the
//     share lock any read takes, on the one connection the workspace's pool
//     lends the command; no transaction is open while BigQuery is asked. The
//     audit refuses while the target's baseline or backfill is incomplete.
//   - Needs PostgreSQL 14 or later at the source (`bit_xor`); the SDK's
//     databases on Cloud SQL are 15 or later.
//   - What it costs. In PostgreSQL one pass per audit, in pages (below), over
//     each audited entity's captured history rows and the baselines, reading
//     five fields of each event and appending to the session's temporary table
//     one row per record for each page it appears in; the buckets, and the
//     records of buckets that differ, are read from that table. In BigQuery
//     one query over the generation's rows of seven columns (never `payload`),
//     so the bytes billed are those columns' size for the generation, twice
//     when buckets differ. What moves is bounded by the buckets: about 200 KB
//     from PostgreSQL and 380 KB from BigQuery for a clean audit of a million
//     records, plus the records of the differing buckets (about 250 each at a
//     million). Measured in Performance.
//   - Paged at the source, whatever the history holds. A record's latest state
//     needs all its events, and a checksum of latest states does not add up
//     across pages of events, so the audit collects latest states in a
//     temporary table of its own session (private to it, written without WAL,
//     dropped when the audit ends) in pages of 50,000 events: the generation's
//     baselines by id, then each entity's history rows by revision along the
//     seed's revision index, each page appending, per record, its event of the
//     highest revision in the page. The buckets and the differing buckets'
//     records are then read from that table, each record's latest row taken
//     across its pages (no index: appending costs half of keeping one row per
//     record). No statement reads more than a page of an entity's events, and
//     no share lock on the SDK's tables is held longer than a page, however
//     long the history (`TestAuditSourceStatementsArePages`). The role needs
//     PostgreSQL's `TEMPORARY` privilege on the database, which every role has
//     unless it was revoked.
//   - Repair. The events to re-deliver go back to pending in pages of 1,000
//     with the replay page's reset (seed 000's `advanceReplicationReplay`)
//     over chosen rows of the active generation only: `accepted_at` and
//     `verified_at` cleared, receipts dropped, `verified_count` kept true; at
//     protocol 3 their receipts are deleted. Then the command drains. Stopped
//     at any point, a repair resumes when run again (what it reset is pending
//     and in flight); once the events have landed and been verified, a new
//     repair finds nothing to re-deliver.
//   - Scheduled. terraform's `audit_schedule` (off by default) runs `job
//     audit` on Cloud Scheduler; each workspace's result is one log line
//     `replication audit` with `outcome` (`equal` INFO, `differs` WARNING,
//     `failed` ERROR), `differences`, `repairable`, `in_flight` and
//     `watermark_revision`, counted by the log-based metric
//     `replication/audit_results` (by workspace and outcome), which the alert
//     "warehouse differs from source" reads.
//
// # Partial replay
//
//   - What is selected. The events of the named entities (the manifest's
//     names, as the views are named; an entity's relationships go with it;
//     default every replicated entity) as the audit reads them — the
//     generation's baselines and its source's captured history rows — of
//     revision `--since-revision` or later, of the `--records` keys if given,
//     that Pub/Sub accepted before `--accepted-before` (default: when the
//     replay starts, by the database's clock). Events already pending are left
//     alone, and so are events captured after the replay began.
//   - How. Page by page, each page its own transaction: it reads the next
//     5,000 of an entity's events by history id and the selected ones'
//     delivery rows of this generation, holding no lock but a read's, and only
//     when some are to go back locks the target row and resets them with the
//     seed's replay-page reset, the bound checked again on each row (target
//     row, then the rows in key order; `accepted_at`, `verified_at` cleared,
//     receipts dropped, the verified ones subtracted from `verified_count`,
//     the target row written only then; at protocol 3 their receipts are
//     deleted). Never another generation's rows, never the lifecycle lock; the
//     replay's drain publishes as it goes, taking turns with the pages, as for
//     a whole replay. The result says how many events went back and the bound
//     it used (`selection.accepted_before` in `--json`), and names the
//     `--records` keys of which no event was selected (`unmatched_records`).
//     A selection by records or revision that holds no event at all (keys
//     that are no record, a revision past every event) is an error,
//     ErrNothingSelected (exit 1), not a replay of nothing reported as done.
//   - Resume. Stopped at any point, run it again with the `--accepted-before`
//     its line gives (the interrupted run says so): what it already sent back
//     is pending or was accepted after that bound, so the rerun neither starts
//     over nor touches the events published since.
//
// # Events whose publish fails alone
//
// A failure other than a refusal (say `RESOURCE_EXHAUSTED` from a proxy's
// message limit, or a request too large to finish within the publish time-out)
// looks the same whether Pub/Sub is down or one event cannot go
// through. A request of several events that fails marks its largest event;
// the next batch publishes that event alone first and then the others. After
// 3 failures of it alone in a row, with one code, no other request of the
// process failing in between and Pub/Sub taking other events meanwhile, it
// is set aside with `publish_failed` (the code in `job set-aside`'s detail,
// the error in the drain's log). An event that comes in a batch of its own
// (past the SDK's byte bound) has nothing beside it to tell: the wake-up
// whose lone event failed keeps it claimed and drains the next batch beside
// it, so the events behind it flow at once (`job drain` does the same).
// During an outage every request fails and nothing is set aside
// (`TestAnEventThatFailsAloneIsSetAside`, `TestAnOutageSetsNothingAside`).
// Each process counts on its own: with N drain instances an event is set
// aside after at most 3 × N wake-ups.
//
// # A verifier pass
//
//   - Fair share. Each workspace may start rounds for its share of what
//     remains of the budget (workers × remaining time / workspaces left, at
//     least 200 ms); a round it started runs to its end within the pass, so a
//     slow lookup is never cut and wasted, and time a workspace does not need
//     goes to the others. The pass's `VERIFY_WORKERS` (16) workspaces look up
//     side by side, so 40 workspaces with BigQuery answering after 2 s need a
//     few rounds of 2 s, not 80 s (`TestVerifyFortyWorkspacesWithSlowBigQuery`
//     answers no lookup until eight are in flight at once, and every workspace
//     is verified in one pass).
//   - Not reached is said. A workspace the budget did not reach is
//     `not_reached` in the answer, listed in `not_reached`, and counted in the
//     pass's log line (WARN); the next pass of the same instance starts with
//     the workspaces whose verification ended longest ago — those not reached
//     or not finished first — so passes in turn cover a fleet larger than one
//     pass reaches. Shard the registry (`verifier_shards`) when passes keep
//     not reaching workspaces.
//   - One query per table. Workspaces whose events land in one BigQuery table
//     (same project, dataset and table) are verified together, up to ten at a
//     time: one lookup answers every member's due ids (`generation IN
//     UNNEST(@generations) AND event_id IN UNNEST(@ids)`; event ids are unique
//     across generations). `shared_lookups` counts the queries saved.
package delivery
