// Package delivery is the one orchestration of replication delivery, called
// by the Drain and Verify functions and by the job alike.
//
// # Drain
//
// Wake is a wake-up of a workspace's drain, which the ontology service
// sends after every commit and awaits inside the customer's action. It is
// answered at once, with no database or network call: the workspace's
// drainer in this process counts the wake-up and is started if it is not
// running, and the answer says so (Promised; Coalesced when it joined a
// running drainer). The drainer works behind the answer:
//
//   - It claims the oldest pending events (disjoint from other claims,
//     holding no lock the SDK waits on; see the store's claims) as one
//     byte-bounded batch, publishes it as one Pub/Sub request, and
//     acknowledges it only after Pub/Sub accepted it; it keeps up to
//     Config.BatchesOut batches out at once on one session, so that its
//     delivery keeps up with a slow Pub/Sub.
//   - On a busy workspace (its wake-ups reach the process more often than
//     Config.QuietInterval) it takes the workspace's next turn first,
//     waiting in the server for the drainers of other processes ahead of
//     it, and gathers for Config.Gather before its claim, so that one claim
//     takes the commits of many wake-ups, this process's and the others'
//     (see Turns in the store's doc): the database pays per batch, not per
//     wake-up. A quiet workspace's drainer claims at once, on no turn.
//   - Events that cannot be published are set aside with a backoff, and the
//     events behind them go on: those the store found unpublishable
//     (missing history row, table without a capture trigger, malformed
//     capture), those larger than a request may be, and those Pub/Sub
//     refuses, found by bisection of the refused request. Events set aside
//     before, whose backoff has passed, go in a request of their own. Each
//     batch that sets events aside logs one error line naming them.
//
// The drainer's rules are one pure function (nextStep, specified by a
// table test), and its loop performs their steps.
//
// # A wake-up's word
//
// The SDK wakes the drain once per commit and never retries, so a wake-up
// answered 2xx is a promise: its commit is published by the drainer of the
// process that answered, never left to a later wake-up or the verifier's
// sweep. The rule that keeps it: a wake-up answered 2xx came before a claim
// that this drainer will still make. The drainer counts the wake-ups it
// answered and records, before each claim, the count that claim began
// after; it ends only when no wake-up came after its last claim, that
// claim left nothing more pending, found nothing held by other claims,
// and nothing is out or failing. So:
//
//   - A wake-up that comes while a batch is out gets a claim of its own,
//     beside the batch (up to Config.BatchesOut), or after a gathering on
//     the turn.
//   - A fault (a claim, publish or acknowledgement failed: Pub/Sub down or
//     slow past its time-out, a lost session, the lifecycle lock held by a
//     migration past the lock timeout, the turn held past Config.TurnWait)
//     is logged (LogDrainFault, with its cause) and the drainer claims
//     again after a backoff (100 ms doubling to 5 s, or to a minute when
//     the fault needs a person), for as long as its process lives: it never
//     gives up. Meanwhile it is failing, and a wake-up is answered
//     ErrDrainRetrying (503: the SDK logs it as deferred): its commit is
//     still claimed once the drainer recovers, but nothing is promised on a
//     failing drainer.
//   - Events another claim holds (another instance's drainer, the sweep, a
//     job) are looked at again after a backoff (100 ms doubling to 2 s)
//     until none is held: their holder may never publish them (its process
//     froze: the server ends its session after the store's IdleTimeout; or
//     it let them go unpublished).
//   - A publish slower than the server's idle timeout does not cost the
//     session: the drainer touches it while its batches are out, so the
//     server ends a session only when its process has stopped.
//   - A drainer that froze while it held the next turn is ended by the
//     server after the store's IdleTimeout (15 s), shorter than the drainers
//     behind it wait for it (TurnWait, 20 s).
//
// What a promise cannot outlive is its own process: killed or frozen, its
// drainer carries nothing, and what it left pending (nothing is
// acknowledged that was not published) waits for the next wake-up, any
// instance's, or the verifier's sweep. Shutdown (Cloud Run's SIGTERM) stops
// taking wake-ups (ErrShuttingDown, 503), lets each drainer claim what it
// promised and publish and acknowledge its batches within the grace, and
// logs what it left when the grace ran out (LogDrainLeft). The chaos proof (`go run ./job/chaos`) measures
// how many promised commits only the sweep delivered.
//
// At protocol 3 a claim holds the turn from its scan to its end (the
// store's legacy claims), so no two drainers publish the same events; the
// drainer there has one batch out at a time.
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
// drainer claims again after every fault, for as long as its process
// lives (see A wake-up's word).
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
// The decision holds until a finish writes it: when the batch's session
// ends first, the event is pending again and its next claim sets it aside
// with no fourth publish (`TestASetAsideLostWithItsSessionIsNotPublishedAgain`).
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
