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
// of its own, and Turn.Claim on the connection of a wake-up's drain turn
// (QueueTurn and TakeTurn: the wake-ups of a workspace coalesce; see Turns); a Session claims batch
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
// # Claims
//
// The seed's drain reads the next batch without locking anything
// (pendingReplicationEvents) and, after Pub/Sub accepted it, acknowledges it
// in a short transaction that takes the shared lifecycle lock
// (acknowledgeReplicationV4). Concurrent drains then publish the same
// events. A claim marks its events as taken without holding any lock that
// an SDK writer or a lifecycle operation can wait on, so that Pub/Sub's
// latency never becomes the SDK's:
//
//   - The claim runs on a connection held, idle and outside any
//     transaction, until the batch is finished or released: a connection of
//     its own (ClaimActive), or a drain's Session, which claims batch after
//     batch on one connection. Its statement takes a session-level advisory
//     lock on each event it returns, with the two-key form
//     pg_try_advisory_lock(class, key) (class: hashtext of ClaimLockClass;
//     key: hashtext of the event id), which the SDK's one-key lifecycle lock
//     can never conflict with. Another drain's claim skips events whose lock
//     it cannot take, so concurrent drains take disjoint batches without
//     waiting on each other.
//   - No table, row or lifecycle lock is held while the batch is published.
//     The acknowledgement is the seed's short transaction, run after the
//     publish (shared lifecycle lock, then the delivery rows), so
//     accepted_at and next_verify_at are the time Pub/Sub had accepted the
//     batch. A Session's claim's locks are released after its COMMIT; a
//     claim of its own connection (the drain's) sends the lifecycle lock,
//     the acknowledgement and the unlock as one implicit transaction, so
//     its locks go just before it commits, once its update holds every row
//     of the batch (a claim in between skips those rows: see below;
//     TestFinishLetsGoBeforeItsCommit). A connection goes back to the pool
//     only after that unlock succeeded; otherwise it is closed, which frees
//     its locks.
//   - Locks do not honour snapshots: a drain may take the lock of an event
//     another drain acknowledged and unlocked after this drain's statement
//     took its snapshot. So, after its try-locks, the same statement finds
//     each row it claimed again by the row version it read (ctid) and reads
//     that version's xmax as it is then. A version no transaction has
//     updated or locked (xmax 0, every row the SDK queued and nobody
//     touched since) is the newest: still pending. Any other (an
//     acknowledgement committed after the snapshot, or one still running,
//     or a row lock or update left behind) is locked FOR NO KEY UPDATE SKIP
//     LOCKED by its primary key, with the pending predicate, which
//     PostgreSQL's recheck of a locked row in READ COMMITTED evaluates on
//     the row's newest version: a row an acknowledgement or a replay page is
//     still updating (the SDK's own, which honour no claim) is skipped; a
//     version that was only locked, or whose update rolled back, is still
//     the newest and is kept when the predicate holds; a row another
//     transaction updated and committed is kept only while its newest
//     version is pending and claimable, so an acknowledgement committed
//     after the snapshot leaves it out (its lock is released with the
//     claim's). The row is found by key, not by the version's ctid, so
//     that this rests on the predicate alone, not on how the server
//     rechecks a TID condition on a newer version
//     (TestClaimLeavesARowAcknowledgedAfterItsSnapshot pauses the
//     statement after its snapshot to hold it). An acknowledgement
//     that ran before the try-lock has always written its xmax by then: it
//     updated the row before it unlocked, and it unlocked before or after
//     it committed: either way the row is not the newest. The row locks last
//     as long as the claim's statement; an acknowledgement or a replay page
//     that wants the same rows waits that long at most, never across a
//     publish. Duplicates stay limited to lost publish responses and
//     crashes. (The store's first claims read the claimed rows again in a
//     second statement, a snapshot after the locks: a second round trip and
//     a second primary-key lookup of every row. Row-locking every
//     candidate, or every claimed row, cost more: a WAL record and a dirtied
//     page a row, for rows the acknowledgement writes again moments later.)
//   - The try-locks run over a materialised list of candidates with no LIMIT
//     above them, so every lock taken belongs to a returned row (a lock
//     function in a WHERE under a LIMIT can lock rows the query then drops).
//     Candidates whose lock another drain holds are skipped; the claim goes
//     on to the next candidates in revision order until it has a batch's
//     worth.
//   - The same statement reads the claimed events from the history tables
//     the Store met in its recent claims (at most maxReadTables, and the
//     baselines), one primary-key lookup each; the events of other tables
//     are read in a second statement, as the first claims read every event
//     (readEvents: a snapshot after the locks, rows still pending), and
//     their tables join the list.
//
// A drain that dies mid-publish: if its process or connection ends, the
// server frees its locks at once and the next drain takes its events. If it
// hangs with its connection open, the session's idle_session_timeout
// (Config.ClaimIdleTimeout, 60 s by default, set by a claim's first lock and
// reset when its locks are released) ends the session once it has been idle
// that long, which frees them. Either way
// the events stay pending and nothing is acknowledged that Pub/Sub did not
// accept.
//
// Session-level advisory locks and settings need a session of their own:
// connect directly (Cloud SQL's connector or TCP) or through a pooler in
// session mode. Behind a transaction-mode pooler (PgBouncer
// pool_mode=transaction) the lock would stay with a server connection that
// other clients then use, and concurrent drains would skip or duplicate
// events; such a pooler is not supported.
//
// # Turns
//
// The ontology service wakes the drain after every commit, and a drain
// that claimed per wake-up would cost the database a claim and an
// acknowledgement per commit. Instead the drains of a workspace take turns,
// met at the workspace's database (one database is one workspace, whichever
// instance of the drain a wake-up reaches), with two session advisory
// locks of the two-key form (class: hashtext of DrainTurnClass), which the
// SDK's one-key lifecycle lock and the claims' own class never meet:
//
//   - the turn (key turnDrain): its holder claims, publishes and
//     acknowledges; its claim and acknowledgement run on the turn's
//     connection, and the acknowledgement's unlock of every lock the
//     session holds ends the turn;
//   - the next turn (key turnNext): held by the one drain that will claim
//     next and has not claimed yet. It is taken first, with the turn when
//     both are free, or alone while another drain holds the turn; the
//     turn is never taken without it. Its holder may gather commits for a
//     moment before it claims, with the turn free or not; its claim's first
//     statement takes the turn, when it does not hold it, waiting in the
//     server (bounded) for the drain that holds it, and then lets the next
//     turn go, before the candidates' statement takes its snapshot; the
//     drains waiting for the next turn (one per process at most) queue
//     behind it in the server.
//
// A drain that must claim (the first of its process to wait, see
// delivery.Service.Drain) takes its place in one statement (sqlQueueTurn):
// the next turn (with the turn if that is free too) if it is free, or else
// it waits in the server for the next turn, a lock wait, bounded. It never
// waits for the turn there: its claim does, after its gathering, when the
// turn is still held; a drain that gathered finds the turn nearly always
// free by then, and so a claim nearly always costs one lock wait in the
// server at most (for the next turn), where it cost two. Its process's later wake-ups are coalesced into it without a
// statement until its claim, so a busy workspace costs the database a
// statement per drain that claims, not one per wake-up. A drain that goes
// on after a full batch takes the next turn (and the turn) only if free,
// or else does nothing (sqlTakeTurn): the drain that holds the next turn
// takes what is left. No wake-up is lost. A wake-up comes after its
// commit, so its events are visible to any claim whose statement starts
// after it looked. A wake-up coalesced into its process's pending drain
// looked before that drain's claim, which the drain sends only after it
// stops being pending. A drain that took or waited for the next turn
// claims after that. A drain that found the next turn held by another did
// so before that one claimed, whose claim then takes its events, up to the
// byte bound (events beyond it are pending and more is reported; the drain
// function goes on while more are pending). A drain that dies frees its
// locks with its session; if it dies while its statement waits in the
// server (for the next turn, or in its claim for the turn), the server
// notices within a second (the pools' client_connection_check_interval)
// and ends the wait, instead of holding the next turn to the end of the
// wait's bound. One that freezes holding the turn or the next turn (its
// instance stopped or cut off) is ended by the server after
// Config.TurnIdleTimeout (15 s) idle: every statement that takes a turn
// (sqlTakeTurn, sqlQueueTurn, and the claim's first locks on a turn) sets
// the session's idle_session_timeout to it, and the turn's end (its
// acknowledgement's unlock, Turn.End, a claim's release) puts the
// session's own setting back. That is shorter than the drains behind it
// wait for a turn (20 s), so they take it within their bound. A drain whose
// wait ends past its bound (ErrTurnWait) queues again
// (delivery.Service.Drain). An idle workspace costs nothing: no drain runs,
// and no statement is sent, until a wake-up comes.
//
// At protocol 3 the SDK's scan locks nothing, so a legacy claim holds the
// turn from its scan to its end (claimLegacy): a wake-up's on its turn's
// session, any other (a quiet wake-up, the sweep, a bulk drain) on a
// session that takes the turn first. No two drains scan and publish the
// same events.
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
// The ontology service shares its Cloud SQL instance, keeps only a handful
// of connections, and its action transactions wait at most 5 s for a lock.
// So:
//
//   - No lock the SDK waits on is held while a batch is published. A claim
//     marks its events with session-level advisory locks of its own (the two-key
//     form, which the SDK's one-key lifecycle lock can never meet), taken
//     by its one short statement on a connection it then holds idle, outside
//     any transaction, until the batch is finished. The acknowledgement is the
//     SDK's own short transaction after the publish (the shared lifecycle
//     lock, then the delivery rows and receipts), so `accepted_at` is the time
//     Pub/Sub had accepted the batch. A pause, a replay start or a migration
//     never waits for a publish, and SDK writers never queue behind one.
//     Concurrent drains skip the events others hold and take disjoint batches.
//     After its claims, the claim's statement looks at each claimed row's
//     version again: one that another transaction has updated or locked since
//     it was written (an acknowledgement that committed after the statement's
//     snapshot, or is still running) is locked for the statement only (`FOR NO
//     KEY UPDATE SKIP LOCKED`), read again at its newest version and left out
//     unless still pending, and one being updated is skipped; untouched rows,
//     nearly all, need no row lock. Duplicates stay limited to lost publish
//     responses and crashes. The same statement reads the claimed events from
//     the history tables recent claims met (a second statement reads the
//     others').
//   - Wake-ups take turns. A workspace's wake-ups meet in its database through
//     two more session advisory locks of the two-key form (a class of their
//     own: the turn and the next turn), so that at most one drain claims at a
//     time and one waits: a wake-up that finds both taken sends that one
//     statement and nothing else. No wake-up is lost: it is coalesced only
//     into the drain that holds the next turn, which has not claimed yet and
//     lets the next turn go in the statement before its claim (`go doc
//     ./shared/store`, Turns). The turn's locks, like the claims', are never
//     taken by the SDK; the drain waiting for the turn waits in the server, at
//     most 20 s.
//   - A bulk drain holds one connection. `job drain` (and the drains of
//     `backfill`, `replay` and `repair`) claims and acknowledges every batch
//     on one session, with `DATABASE_POOL_SIZE` batches out at once: each
//     round trip acknowledges the batches whose publishes have ended (one
//     transaction, every row in key order), releases their claims after its
//     COMMIT and claims the next batch after the last one's candidates, so
//     that its own claims never meet; it starts from the head of the queue
//     again once none is out. A backfill's or replay's pages take turns with
//     that drain (every 10 pages, and at the end), so that the server never
//     runs a page and a claim at once. Four drains on four connections
//     contended for the head of the queue: on the same work the server spent
//     1.58× the floor's CPU, against 1.06–1.08× now (Performance).
//   - A drain that dies mid-publish: if its process or connection ends, the
//     server frees its claims at once and the next drain takes its events; if
//     it hangs with its connection open, the session's `idle_session_timeout`
//     (60 s) ends it. The events stay pending; nothing is acknowledged that
//     Pub/Sub did not accept. The claims need a session of their own: connect
//     directly (Cloud SQL's connector, or TCP) or through a pooler in session
//     mode — a transaction-mode pooler (PgBouncer `pool_mode=transaction`) is
//     not supported.
//   - Every transaction sets `statement_timeout` (30 s) and `lock_timeout` (5
//     s) locally, and every session has them as defaults (they also bound the
//     statement preparation pgx does before a pipeline runs). The lifecycle
//     lock is taken in the SDK's order (the singleton row, then the advisory
//     lock); the shared lock comes before any delivery row or table, in the
//     acknowledgement and in the claim's reads. Statements that update a set
//     of delivery rows (acknowledge, set aside, verify, retry, a replay page)
//     lock them in primary-key order, so that they wait for each other instead
//     of deadlocking.
//   - Every value is a bind parameter. History tables are never derived from
//     names: a delivery row's `history_table` is checked against the tables
//     that carry the SDK's `_ontology_capture` trigger, and an entity's
//     history table is the one whose trigger runs its capture function, so
//     renames are followed (a cached table that has gone is looked up again)
//     and the database role needs no access to business tables.
//
// Where the store improves on the SDK's statements it says so in the code,
// and the tests run the SDK's statements beside the store's and compare what
// both leave:
//
//   - Claims (above); the SDK's unlocked read (`PendingEvents`, with the SDK's
//     strict byte bound) is kept, in the store's tests, as the oracle the
//     claim is compared with.
//   - An event that cannot be published fails the SDK's read (a missing
//     history row, an event past the byte bound); a claim sets it aside, or,
//     past the SDK's byte bound but within Pub/Sub's 10 MB, returns it alone
//     to be published in a request of its own. The set-aside lives in two
//     columns no seed statement reads on a pending row (`last_checked_at`, and
//     `next_verify_at` one of the backoffs later); the SDK still sees the
//     event as pending, as it is.
//   - The message is built exactly as the SDK builds it: the captured jsonb's
//     keys in JavaScript's order with their values as captured (a `null`
//     `record_key` stays `null`), the target's `generation`, then `event_id`;
//     checked against Node.js running the SDK's expression.
//   - Backfill and replay pages select the same rows as the SDK's but walk the
//     primary key from the cursor: the SDK's `($2 IS NULL OR id > $2)` and
//     `ORDER BY` of the text id made every page rescan the table. The page
//     read feeds the insert (backfill) or the reset (replay) directly, instead
//     of sending the ids back as a JSON list to be found again; a replay page
//     deletes the receipts of the rows it reset in a statement of its own, so
//     it also removes the receipt of an acknowledgement that committed while
//     the reset waited for its row. Tests check the plans.
//   - Acknowledge, verify, retry and the event reads find their rows by
//     primary key: the SDK's statements filter on the state predicate of a
//     partial index, which, with statistics taken while that index was nearly
//     empty, made PostgreSQL scan the whole index for every batch, and they
//     send the ids as a JSON array, which made it hash-join a scan of a small
//     table. The store writes the same predicate as `(CASE WHEN … THEN true
//     END)` and takes the ids as a `uuid[]` matched with `= ANY (ARRAY(SELECT
//     unnest($2)))` (the package doc of `shared/store` says why).
//   - The target table is vacuumed every 20 pages (`VACUUM (SKIP_LOCKED)`,
//     outside the page's transaction): every backfill and replay page updates
//     its large target row, as the SDK's do, and the versions left behind slow
//     each page's foreign-key checks until autovacuum comes by. VACUUM needs
//     the table's owner (or `MAINTAIN` on PostgreSQL 16+); without it the
//     store logs once that it cannot, and the pages run as autovacuum keeps
//     them.
package store
