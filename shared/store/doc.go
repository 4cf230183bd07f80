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
// of its own (the verifier's sweep, a protocol-3 database); a Session
// claims batch after batch on one connection, several out at once, its Next
// acknowledging the ended ones and claiming the next in one round trip
// (the drain function's drainers, which take the workspace's turns on it:
// see Turns; and the job's bulk drain). DueUnverified lists accepted events to look up
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
// server frees its locks at once and the next drain takes its events. If
// its process freezes with its connection open, the session's
// idle_session_timeout (Config.IdleTimeout, 15 s by default, set by a
// claim's first lock and reset when its locks are released) ends the
// session once it has been idle that long, which frees them. A live holder
// never meets it, however long its publish: it touches its session every
// IdleTimeout/3 while its batches are out (a Session's owner calls Touch;
// a claim of its own connection touches it from a goroutine of its own,
// stopped before the claim's end uses the connection). Either way the
// events stay pending and nothing is acknowledged that Pub/Sub did not
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
// The ontology service wakes the drain after every commit, and the drain
// function's drainers (one per workspace in each process) would each
// claim for the commits of their own process's wake-ups: on a busy
// workspace, every process a claim and an acknowledgement every few
// commits. Instead a busy workspace's drainers take turns, met at the
// workspace's database (one database is one workspace, whichever process
// a wake-up reaches), with two session advisory locks of the two-key form
// (class: hashtext of DrainTurnClass), which the SDK's one-key lifecycle
// lock and the claims' own class never meet:
//
//   - the next turn (key turnNext): held by the one session that claims
//     next and has not claimed yet. Session.QueueTurn takes it, with the
//     turn when that is free too, in one statement (sqlQueueTurn), or waits
//     in the server for the session that holds it (bounded). Its holder
//     gathers commits for a moment (the drainer's gather), while the
//     sessions that want it after it wait in the server.
//   - the turn (key turnDrain): held for a claim's statements only. The
//     claim's first statement takes it when the session does not hold it
//     (waiting, bounded, for a claim in progress) and lets the next turn
//     go, before the candidates' statement takes its snapshot; the
//     statement after the candidates lets the turn go. The turn is never
//     held across a publish: the next turn's holder claims what came after
//     while this batch is out.
//
// So the claims of a workspace come one after another, each after a
// gathering, and each drainer's claim comes after every wake-up it
// answered (its wake-ups were counted before it sent the claim, and each
// came after its commit): no commit whose wake-up was answered is left to
// a claim that did not see it. An idle workspace costs nothing: no drainer
// runs, and no statement is sent, until a wake-up comes. A session that
// dies frees its locks with it; if it dies while its statement waits in the
// server (for the next turn, or in its claim for the turn), the server
// notices within a second (the pools' client_connection_check_interval)
// and ends the wait. One that freezes while it holds the next turn (its
// process stopped) is ended by the server after Config.IdleTimeout (15 s)
// idle: the turn's statement sets the session's idle_session_timeout to it,
// and the session's release of its locks puts the session's own setting
// back. That is shorter than the drainers behind it wait for a turn (20 s),
// so they take it within their bound; a wait past its bound fails with
// ErrTurnWait, a fault the drainer backs off from.
//
// At protocol 3 the SDK's scan locks nothing, so a legacy claim holds the
// turn from its scan to its end (claimLegacy), on a session that takes it
// first. No two drains scan and publish the same events.
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
//   - Busy workspaces' drainers take turns. A busy workspace's drainers meet
//     in its database through two more session advisory locks of the two-key
//     form (a class of their own: the turn and the next turn), so that one
//     claims at a time, after a gathering, and the others wait in the server
//     for the next turn, one statement each (`go doc ./shared/store`, Turns).
//     The turn's locks, like the claims', are never taken by the SDK; a
//     drainer waiting for a turn waits in the server, at most 20 s.
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
//     its process freezes with its connection open, the session's
//     `idle_session_timeout` (15 s; live holders touch their sessions) ends
//     it. The events stay pending; nothing is acknowledged that
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
