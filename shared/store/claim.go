package store

// This file is long because of its design comment (the claim's locking,
// which every change to it must keep); the code is the claim's candidates
// and locks only: its events read is read.go, its end finish.go.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/segmentstream/ontology-replication/shared/event"
)

// Claims.
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
//     batch; the claim's locks are released after its COMMIT. A connection
//     goes back to the pool only after that unlock succeeded; otherwise it
//     is closed, which frees its locks.
//   - Locks do not honour snapshots: a drain may take the lock of an event
//     another drain acknowledged and unlocked after this drain's statement
//     took its snapshot. So, after its try-locks, the same statement finds
//     each row it claimed again by the row version it read (ctid) and reads
//     that version's xmax as it is then. A version no transaction has
//     updated or locked (xmax 0, every row the SDK queued and nobody
//     touched since) is the newest: still pending. Any other (an
//     acknowledgement committed after the snapshot, or one still running,
//     or a row lock or update left behind) is locked FOR NO KEY UPDATE SKIP
//     LOCKED by that version's ctid, with the pending predicate: a row an
//     acknowledgement or a replay page is still updating (the SDK's own,
//     which honour no claim) is skipped; a version that was only locked, or
//     whose update rolled back, is still the newest and is kept when the
//     predicate holds; a version another transaction updated and committed
//     is left out, pending or not, because PostgreSQL's recheck of a locked
//     row in READ COMMITTED evaluates the conditions on the newest version,
//     whose ctid is another one. Such a row stays pending for the next
//     claim (its lock is released with the claim's). An acknowledgement
//     that ran before the try-lock has always written its xmax by then: it
//     updated the row before it committed and unlocked. The row locks last
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

// ClaimLockClass names the first key of the claim's advisory locks.
const ClaimLockClass = "segmentstream.ontology.replication.claim"

// claimPageSize is how many candidates one claim read considers.
const claimPageSize = event.MaxBatchEvents

// maxClaimPages bounds the candidate pages one claim reads past events that
// other drains hold.
const maxClaimPages = 16

// sqlClaimSession sets the timeouts of a claim's read (local to its
// implicit transaction) and takes the shared
// lifecycle lock for the read only: a read of several tables in one
// transaction then never holds one table's lock while a migration, which
// takes the lifecycle lock exclusively first, holds another's. The read
// commits within milliseconds, before anything is published.
const sqlClaimSession = `SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true),
  pg_advisory_xact_lock_shared(hashtextextended($3, 0))`

// sqlClaimable is what the store adds to the seed's pending predicate
// (accepted_at IS NULL): a pending row that was set aside (see SetAside) is
// skipped until its backoff has passed. $3 is the set of backoffs the store
// writes, in microseconds; the seed's retry moves next_verify_at exactly
// 30 s past last_checked_at, which is not one of them.
var sqlClaimable = `NOT (next_verify_at > now() AND ` + setAsideMarked("$3") + `)`

// maxReadTables bounds the history tables whose events a claim's statement
// reads itself (see readTables); the baselines come on top.
const maxReadTables = 4

// sqlCandidates is the read of pendingReplicationEvents at protocol 4 (seed
// 000): the oldest outstanding references in revision order, from the
// partial index _ontology_delivery_pending, so that the read does not grow
// with retained history, each try-locked for the claim, the claimed ones
// found again by version and, when another transaction touched them, locked
// FOR NO KEY UPDATE SKIP LOCKED for the statement (see above), each with
// whether it was claimed, its lock's key, whether it is still pending, and
// its row's last set-aside backoff (next_verify_at −
// last_checked_at, in microseconds). The claims are put in order by the uuid
// (candidates.event_id), not by the text the query returns under the same
// name, which would sort by the database's collation (strcoll under
// en_US.UTF-8, Cloud SQL's default). Each claimed row comes with its event
// when it is a baseline or its history table is one of the read tables
// ($4, bare names, in the order of the %[2]s branches: the seed's
// per-table reads, sqlBaselineEvents and sqlHistoryEvents, one primary-key
// lookup a row), and then, for an event that is NULL, whether its row
// exists (its replication column is NULL) or is gone. $1 is the
// generation (NULL: the active generation, when replication is enabled);
// $2 is ClaimLockClass; $3 the store's
// backoffs; $5 the session's idle_session_timeout while it holds claims
// (Config.ClaimIdleTimeout), set with the first lock the statement takes,
// so that a claim that took none leaves its session as it was. %[1]s bounds the page: nothing on the first,
// sqlCandidatesAfter on the next ones, which walk the index from the last
// candidate. %[2]s and %[3]s are the read tables' branches
// (readBranches).
var sqlCandidates = `WITH candidates AS MATERIALIZED (
    SELECT ctid AS at, generation, event_id, history_table, revision, next_verify_at, last_checked_at FROM _ontology_replication_delivery
     WHERE generation = coalesce($1::uuid, (SELECT active_generation FROM _ontology_replication WHERE id AND enabled))
       AND accepted_at IS NULL %[1]s AND ` + sqlClaimable + `
     ORDER BY revision, event_id LIMIT 100
  ), claims AS MATERIALIZED (
    SELECT candidates.*, pg_try_advisory_lock(hashtext($2), hashtext(event_id::text))
             AND set_config('idle_session_timeout', $5, false) IS NOT NULL AS claimed,
           CASE WHEN history_table IS NULL THEN 0 ELSE array_position($4::text[], history_table) END AS source
      FROM candidates ORDER BY candidates.revision, candidates.event_id
  ), seen AS MATERIALIZED (
    SELECT ctid AS at, event_id, xmax = '0'::xid AS newest FROM _ontology_replication_delivery
     WHERE ctid = ANY (ARRAY(SELECT at FROM claims WHERE claimed))
  ), held AS MATERIALIZED (
    SELECT event_id FROM _ontology_replication_delivery
     WHERE ctid = ANY (ARRAY(SELECT at FROM seen WHERE NOT newest)) AND accepted_at IS NULL AND ` + sqlClaimable + `
       FOR NO KEY UPDATE SKIP LOCKED
  ), still AS (
    SELECT claims.*, claimed AND (event_id IN (SELECT event_id FROM seen WHERE newest) OR event_id IN (SELECT event_id FROM held)) AS pending
      FROM claims OFFSET 0
  ), events AS (
    SELECT still.*, CASE WHEN pending THEN CASE source
             WHEN 0 THEN (SELECT b.event FROM _ontology_replication_baselines b WHERE b.generation = still.generation AND b.id = still.event_id)%[2]s
           END END AS event
      FROM still OFFSET 0
  )
  SELECT event_id::text, history_table, revision, ` + sqlSetAsideInterval + `, claimed,
         CASE WHEN claimed THEN hashtext(event_id::text) END, pending, source IS NOT NULL, event,
         CASE WHEN pending AND event IS NULL THEN CASE source
           WHEN 0 THEN EXISTS (SELECT FROM _ontology_replication_baselines b WHERE b.generation = events.generation AND b.id = events.event_id)%[3]s
         END END
    FROM events`

const sqlCandidatesAfter = `AND (revision, event_id) > ($6::bigint, $7::uuid)`

// candidatesStatement returns sqlCandidates with the read tables' branches
// (their quoted identifiers, checked against the capture-trigger tables),
// for the first page or, with next, the following ones.
func candidatesStatement(read []string, next bool) string {
	var events, present strings.Builder
	for i, ident := range read {
		fmt.Fprintf(&events, "\n             WHEN %d THEN (SELECT h.replication FROM %s h WHERE h.id = still.event_id)", i+1, ident)
		fmt.Fprintf(&present, "\n           WHEN %d THEN EXISTS (SELECT FROM %s h WHERE h.id = events.event_id)", i+1, ident)
	}
	after := ""
	if next {
		after = sqlCandidatesAfter
	}
	return fmt.Sprintf(sqlCandidates, after, events.String(), present.String())
}

// sqlUnlockClaims releases every claim lock of the session and puts its
// idle_session_timeout, which a claim that took a lock sets (see
// sqlCandidates), back to the session's default: the setting lasts as long
// as the claim, never into the connection's next use. Two statements, for
// the simple protocol (Exec without arguments); in a pipeline they are
// sqlUnlockAll and sqlResetIdle.
const (
	sqlUnlockClaims = sqlUnlockAll + "; " + sqlResetIdle
	sqlUnlockAll    = `SELECT pg_advisory_unlock_all()`
	sqlResetIdle    = `RESET idle_session_timeout`
)

// Claim is a claimed batch of pending events: they stay marked as taken
// until Finish or Release, so concurrent drains take disjoint batches.
// The caller must call one of them (a claim with no events and nothing
// unpublishable has already let its locks go; both are then no-ops).
type Claim struct {
	Batch
	// Unpublishable are claimed events the store found it cannot publish:
	// their history row is gone, their table has no capture trigger, or
	// their capture is malformed. Pass them to Finish to set them aside.
	Unpublishable []SetAside

	store  *Store
	target Target
	// conn is the claim's own session (ClaimActive); nil on the legacy path
	// and for a Session's claims, which use the session's.
	conn    *pgxpool.Conn
	session *Session
	out     bool    // a Session's claim, neither finished nor released
	locked  bool    // the claim may hold claim locks
	keys    []int32 // the keys of the claim locks it took (a Session's claims)
	last    *candidate
	// backoffs are the claimed rows' last set-aside backoffs, by history id
	// (those set aside before only).
	backoffs map[string]time.Duration
}

// candidate is one pending delivery row a claim read considered.
type candidate struct {
	id       string
	table    *string
	revision int64
	backoff  time.Duration // its last set-aside backoff, if any
	claimed  bool          // false: another drain holds it
	key      int32         // its claim lock's key, when claimed
	pending  bool          // claimed and still pending when the statement looked again
	read     bool          // the statement read its event: event, present
	event    []byte
	present  bool
}

// ClaimActive reads the replication state and, when replication is enabled
// and has an active target, claims the next batch of its pending events
// on a connection of its own: the state, the target and the claim in one
// round trip. The claim is nil when there is nothing to drain
// (replication disabled, or no active target: the error is
// ErrNoActiveTarget). On a legacy database it reads the SDK's scan.
//
// When a history table the claim's statement reads has gone (an entity
// renamed: undefined_table), the statement never ran; the capture tables
// are looked up again and the claim is made once more.
func (s *Store) ClaimActive(ctx context.Context) (State, Target, *Claim, error) {
	state, t, c, err := s.claimActive(ctx)
	if undefinedTable(err) {
		s.forgetCaptureTables()
		state, t, c, err = s.claimActive(ctx)
	}
	return state, t, c, err
}

// claimActive is one attempt of ClaimActive.
func (s *Store) claimActive(ctx context.Context) (State, Target, *Claim, error) {
	fail := func(err error) (State, Target, *Claim, error) {
		return State{}, Target{}, nil, fmt.Errorf("store: claim pending events: %w", err)
	}
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return fail(err)
	}
	c := &Claim{store: s, conn: conn}
	keep := false
	defer func() {
		if !keep {
			c.Release(ctx)
		}
	}()
	legacyHint := s.legacy.Load()
	var read readTables
	if !legacyHint {
		if read, err = s.readTables(ctx, conn); err != nil {
			return fail(err)
		}
	}
	b := &pgx.Batch{}
	b.Queue(sqlClaimSession, ms(s.cfg.StatementTimeout), ms(s.cfg.LockTimeout), LifecycleLock)
	if legacyHint {
		b.Queue(sqlSchemaPresent)
	}
	// At protocol 4 the schema check is the state read itself: without the
	// singleton it cannot be prepared (undefined_table, handled below).
	b.Queue(sqlState)
	if !legacyHint {
		b.Queue(sqlActiveTargetV4)
		c.locked = true
		s.queueCandidates(b, nil, read, nil)
	}
	results := conn.SendBatch(ctx, b)
	state, t, cands, err := readClaimStart(results, !legacyHint, s.backoffs)
	if cerr := results.Close(); err == nil && cerr != nil {
		err = cerr
	}
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
	case errors.As(err, &pgErr) && (pgErr.Code == "42703" || pgErr.Code == "42P01") && state.Version == 0:
		// A statement of protocol 4 could not even be prepared (a legacy
		// database has no delivery table and no v4 target columns; a
		// database without the schema has neither): nothing ran, so no
		// candidate was locked. The state says which, read on another
		// connection: the claim's session goes back to the pool first, or
		// as many concurrent claims as the pool has connections would each
		// hold one and wait for a second forever.
		c.Release(ctx)
		if state, err = s.State(ctx); err != nil {
			return fail(err)
		}
		if state.Version == ProtocolDelivery {
			return fail(pgErr)
		}
		s.legacy.Store(true)
	case errors.As(err, &pgErr) && pgErr.Code == "42703" && state.Version > 0 && state.Version < ProtocolDelivery:
		// The same, found while running.
		s.legacy.Store(true)
		err = nil
	case errors.Is(err, pgx.ErrNoRows) && state.Version == ProtocolDelivery:
		return state, Target{}, nil, fmt.Errorf("store: read active target: %w", ErrNoActiveTarget)
	default:
		return fail(err)
	}
	if state.Version < ProtocolDelivery {
		c.Release(ctx)
		keep = true // released: the legacy claim needs no session
		state, t, err := s.ActiveTarget(ctx)
		if err != nil || !state.Enabled {
			return state, t, nil, err
		}
		c, err := s.legacyClaim(ctx, t)
		return state, t, c, err
	}
	s.legacy.Store(false)
	if legacyHint {
		// Read as a legacy database last time: read the target and the
		// candidates now.
		if state.ActiveGeneration == "" {
			return state, Target{}, nil, fmt.Errorf("store: read active target: %w", ErrNoActiveTarget)
		}
		// On the claim's own session: a second connection from the pool
		// could wait forever behind claims that each hold one.
		if t, err = scanTarget(conn.QueryRow(ctx, sqlTargetV4, state.ActiveGeneration)); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return state, Target{}, nil, fmt.Errorf("store: read active target: %w", ErrNoActiveTarget)
			}
			return fail(err)
		}
		if !state.Enabled {
			return state, t, nil, nil
		}
		if cands, err = c.candidates(ctx, t.Generation, nil); err != nil {
			return fail(err)
		}
	}
	c.target = t
	if !state.Enabled {
		return state, t, nil, nil
	}
	if err := c.fill(ctx, cands); err != nil {
		return state, t, nil, fmt.Errorf("store: claim pending events of %s: %w", t.Generation, err)
	}
	keep = true
	return state, t, c, nil
}

// readClaimStart reads the results of ClaimActive's first round trip.
func readClaimStart(results pgx.BatchResults, v4 bool, backoffs []int64) (State, Target, []candidate, error) {
	if _, err := results.Exec(); err != nil {
		return State{}, Target{}, nil, err
	}
	if !v4 {
		var present bool
		if err := results.QueryRow().Scan(&present); err != nil {
			return State{}, Target{}, nil, err
		}
		if !present {
			return State{}, Target{}, nil, ErrNoSchema
		}
	}
	state, err := readStateRow(results.QueryRow())
	if err != nil || !v4 {
		return state, Target{}, nil, err
	}
	t, err := scanTarget(results.QueryRow())
	if err != nil {
		return state, t, nil, err
	}
	rows, err := results.Query()
	if err != nil {
		return state, t, nil, err
	}
	cands, err := collectCandidates(rows, backoffs)
	return state, t, cands, err
}

// queueCandidates queues a page of candidates (sqlCandidates) of the
// generation (nil: the active one) after the given candidate (nil: from the
// start), reading the events of the read tables (see readTables).
func (s *Store) queueCandidates(b *pgx.Batch, generation any, read readTables, after *candidate) {
	if after == nil {
		b.Queue(candidatesStatement(read.idents, false), generation, ClaimLockClass, s.backoffs, read.names, ms(s.cfg.ClaimIdleTimeout))
		return
	}
	b.Queue(candidatesStatement(read.idents, true), generation, ClaimLockClass, s.backoffs, read.names, ms(s.cfg.ClaimIdleTimeout), after.revision, after.id)
}

// candidates reads and locks the next page of candidates after the given
// one (nil: from the start) on the claim's session, in one round trip that
// also sets the session's timeouts.
func (c *Claim) candidates(ctx context.Context, generation string, after *candidate) ([]candidate, error) {
	s := c.store
	conn := c.db()
	read, err := s.readTables(ctx, conn)
	if err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	b.Queue(sqlClaimSession, ms(s.cfg.StatementTimeout), ms(s.cfg.LockTimeout), LifecycleLock)
	s.queueCandidates(b, generation, read, after)
	c.locked = true
	results := conn.SendBatch(ctx, b)
	cands, err := func() ([]candidate, error) {
		if _, err := results.Exec(); err != nil {
			return nil, err
		}
		rows, err := results.Query()
		if err != nil {
			return nil, err
		}
		return collectCandidates(rows, s.backoffs)
	}()
	if cerr := results.Close(); err == nil {
		err = cerr
	}
	if undefinedTable(err) {
		s.forgetCaptureTables() // a read table has gone: look them up again next time
	}
	return cands, err
}

// collectCandidates reads sqlCandidates: every candidate, with claimed
// ones marked (the others are held by other drains) with their lock's key,
// the backoff of those last set aside (an interval that is one of
// backoffs), and the events the statement read; in queue order.
func collectCandidates(rows pgx.Rows, backoffs []int64) ([]candidate, error) {
	cands := make([]candidate, 0, claimPageSize)
	var cd candidate
	var interval *int64
	var key *int32
	var present *bool
	var raw []byte
	_, err := pgx.ForEachRow(rows, []any{&cd.id, &cd.table, &cd.revision, &interval, &cd.claimed, &key, &cd.pending, &cd.read, &raw, &present}, func() error {
		cd.backoff = 0
		if interval != nil && slices.Contains(backoffs, *interval) {
			cd.backoff = time.Duration(*interval) * time.Microsecond
		}
		cd.key = 0
		if key != nil {
			cd.key = *key
		}
		cd.event = nil
		if raw != nil {
			cd.event = append([]byte(nil), raw...)
		}
		cd.present = raw != nil || (present != nil && *present)
		cands = append(cands, cd)
		return nil
	})
	// In the order the claims were read: by revision, then by the uuid
	// (which sorts as its text does).
	slices.SortFunc(cands, func(a, b candidate) int {
		return cmp.Or(cmp.Compare(a.revision, b.revision), strings.Compare(a.id, b.id))
	})
	return cands, err
}

// db is the connection the claim's statements run on.
func (c *Claim) db() *pgxpool.Conn {
	if c.session != nil {
		return c.session.conn
	}
	return c.conn
}

// fill completes a claim from the first page of candidates: it reads more
// pages while other drains hold most of them, reads the events the pages
// did not and bounds the batch.
func (c *Claim) fill(ctx context.Context, page []candidate) error {
	s := c.store
	var claimed []candidate
	more := false
	for pages := 1; ; pages++ {
		for _, cd := range page {
			if cd.claimed {
				c.keys = append(c.keys, cd.key)
				if cd.pending {
					claimed = append(claimed, cd)
				}
			}
		}
		if len(page) > 0 {
			c.last = &page[len(page)-1]
		}
		full := len(page) == claimPageSize
		if len(claimed) >= claimPageSize || !full {
			more = full
			break
		}
		if pages == maxClaimPages {
			more = true
			break
		}
		var err error
		if page, err = c.candidates(ctx, c.target.Generation, c.last); err != nil {
			return err
		}
	}
	if len(claimed) > claimPageSize {
		more = true
		claimed = claimed[:claimPageSize] // the rest stay locked until the claim ends
	}
	if len(claimed) == 0 {
		// Nothing to publish. The claim may still hold the locks of rows it
		// found no longer pending (acknowledged or reset since its
		// snapshot): they go now, before the session is reused.
		c.locked = len(c.keys) > 0
		c.More = more
		c.Release(ctx)
		return nil
	}
	var unread []candidate
	for _, cd := range claimed {
		if cd.backoff > 0 {
			if c.backoffs == nil {
				c.backoffs = map[string]time.Duration{}
			}
			c.backoffs[cd.id] = cd.backoff
		}
		if !cd.read {
			unread = append(unread, cd)
		}
	}
	items := make([]captured, 0, len(claimed))
	var aside []SetAside
	var others map[string]captured
	if len(unread) > 0 {
		// Events of tables the statement did not read: read them in a
		// second statement, which keeps only rows still pending, and read
		// their tables in the next claims' statement.
		got, unknown, err := s.readEvents(ctx, c.db(), c.target, unread)
		if err != nil {
			return err
		}
		aside = unknown
		others = make(map[string]captured, len(got))
		for _, it := range got {
			others[it.id] = it
		}
		s.learnReadTables(unread)
	}
	for _, cd := range claimed {
		if !cd.read {
			if it, ok := others[cd.id]; ok {
				items = append(items, it)
			}
			continue
		}
		table := ""
		if cd.table != nil {
			table = *cd.table
		}
		items = append(items, captured{id: cd.id, table: table, raw: cd.event, present: cd.present, backoff: cd.backoff})
	}
	b, bad, err := bound(c.target, items, more)
	if err != nil {
		return err
	}
	c.Batch, c.Unpublishable = b, append(aside, bad...)
	if len(c.Events) == 0 && len(c.Unpublishable) == 0 {
		c.Release(ctx) // every claimed row had been taken meanwhile
	}
	return nil
}

// Release ends the claim without acknowledging anything: its events stay
// pending and other drains may take them at once. It is safe to call after
// Finish, and more than once.
func (c *Claim) Release(ctx context.Context) {
	if c.session != nil {
		c.session.release(ctx, c)
		return
	}
	if c.conn == nil {
		return
	}
	conn := c.conn
	c.conn = nil
	if c.locked || conn.Conn().PgConn().TxStatus() != 'I' {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.store.cfg.StatementTimeout)
		defer cancel()
		err := func() error {
			if conn.Conn().PgConn().TxStatus() != 'I' {
				if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
					return err
				}
			}
			_, err := conn.Exec(ctx, sqlUnlockClaims)
			return err
		}()
		if err != nil {
			// A session that may still hold claim locks never goes back to
			// the pool: closing it frees them.
			_ = conn.Conn().Close(ctx)
		}
	}
	conn.Release()
}

// readTables are the history tables whose events a claim's statement
// reads itself: their bare names and quoted identifiers.
type readTables struct{ names, idents []string }

// readTables returns the tables met in recent claims that still carry the
// capture trigger (the capture tables are loaded on first use); those that
// no longer do (renamed, dropped) are forgotten.
func (s *Store) readTables(ctx context.Context, q querier) (readTables, error) {
	ct, err := s.captureTables(ctx, q, false)
	if err != nil {
		return readTables{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads = slices.DeleteFunc(s.reads, func(name string) bool {
		_, ok := ct.byTable[name]
		return !ok
	})
	read := readTables{names: []string{}}
	for _, name := range s.reads {
		read.names = append(read.names, name)
		read.idents = append(read.idents, ct.byTable[name].Sanitize())
	}
	return read, nil
}

// learnReadTables adds the capture tables of claimed rows whose events a
// claim had to read apart to the tables claims read themselves, the oldest
// dropped past maxReadTables.
func (s *Store) learnReadTables(unread []candidate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.capture == nil {
		return
	}
	for _, cd := range unread {
		if cd.table == nil || slices.Contains(s.reads, *cd.table) {
			continue
		}
		if _, ok := s.capture.byTable[*cd.table]; !ok {
			continue // no capture trigger: set aside, never read
		}
		s.reads = append(s.reads, *cd.table)
		if len(s.reads) > maxReadTables {
			s.reads = slices.Delete(s.reads, 0, 1)
		}
	}
}

// undefinedTable reports PostgreSQL's undefined_table (42P01).
func undefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

// Ended reports whether the claim has been finished or released.
func (c *Claim) Ended() bool {
	if c.session != nil {
		return !c.out
	}
	return c.conn == nil
}
