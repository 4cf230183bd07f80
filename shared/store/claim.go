package store

// This file is long because of its design comment (the claim's locking,
// which every change to it must keep); the code is the claim's candidates
// and locks only: its events read is read.go, its end finish.go.

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
//   - The claim runs on one connection acquired from the pool and held,
//     idle and outside any transaction, until the batch is finished or
//     released. Its read takes a session-level advisory lock on each event
//     it returns, with the two-key form pg_try_advisory_lock(class, key)
//     (class: hashtext of ClaimLockClass; key: hashtext of the event id),
//     which the SDK's one-key lifecycle lock can never conflict with.
//     Another drain's read skips events whose lock it cannot take, so
//     concurrent drains take disjoint batches without waiting on each other.
//   - No table, row or lifecycle lock is held while the batch is published.
//     The acknowledgement is the seed's short transaction, run after the
//     publish (shared lifecycle lock, then the delivery rows), so
//     accepted_at and next_verify_at are the time Pub/Sub had accepted the
//     batch; its COMMIT is followed by pg_advisory_unlock_all(). A
//     connection goes back to the pool only after that unlock succeeded;
//     otherwise it is closed, which frees its locks.
//   - The try-locks run over a materialised list of candidates with no LIMIT
//     above them, so every lock taken belongs to a returned row (a lock
//     function in a WHERE under a LIMIT can lock rows the query then drops).
//     Candidates whose lock another drain holds are skipped; the read goes on
//     to the next candidates in revision order until it has a batch's worth.
//   - Locks do not honour snapshots: a drain may take the lock of an event
//     another drain acknowledged and unlocked after this drain's read began.
//     So the events are read in a second statement (a snapshot taken after
//     the locks) that also keeps only rows still pending: duplicates stay
//     limited to lost publish responses and crashes.
//
// A drain that dies mid-publish: if its process or connection ends, the
// server frees its locks at once and the next drain takes its events. If it
// hangs with its connection open, the session's idle_session_timeout
// (Config.ClaimIdleTimeout, 60 s by default, set by every claim) ends the
// session once it has been idle that long, which frees them. Either way
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
// implicit transaction) and the session's idle timeout, which ends a
// session that sits idle holding claims (see above), and takes the shared
// lifecycle lock for the read only: a read of several tables in one
// transaction then never holds one table's lock while a migration, which
// takes the lifecycle lock exclusively first, holds another's. The read
// commits within milliseconds, before anything is published.
const sqlClaimSession = `SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true),
  set_config('idle_session_timeout', $3, false), pg_advisory_xact_lock_shared(hashtextextended($4, 0))`

// sqlClaimable is what the store adds to the seed's pending predicate
// (accepted_at IS NULL): a pending row that was set aside (see SetAside) is
// skipped until its backoff has passed. $3 is the set of backoffs the store
// writes, in microseconds; the seed's retry moves next_verify_at exactly
// 30 s past last_checked_at, which is not one of them.
var sqlClaimable = `NOT (next_verify_at > now() AND ` + setAsideMarked("$3") + `)`

// sqlCandidates is the read of pendingReplicationEvents at protocol 4 (seed
// 000): the oldest outstanding references in revision order, from the
// partial index _ontology_delivery_pending, so that the read does not grow
// with retained history. Each is try-locked (see above), and each comes with
// its row's last set-aside backoff (next_verify_at − last_checked_at, in
// microseconds). The page is ordered by the uuid (candidates.event_id), not
// by the text the query returns under the same name, which would sort by
// the database's collation (strcoll under en_US.UTF-8, Cloud SQL's
// default). $1 is the generation (NULL: the active generation, when
// replication is enabled); $2 is ClaimLockClass. %s bounds the page:
// nothing on the first, sqlCandidatesAfter on the next ones, which walk the
// index from the last candidate.
var sqlCandidates = `WITH candidates AS MATERIALIZED (
    SELECT event_id, history_table, revision, next_verify_at, last_checked_at FROM _ontology_replication_delivery
     WHERE generation = coalesce($1::uuid, (SELECT active_generation FROM _ontology_replication WHERE id AND enabled))
       AND accepted_at IS NULL %s AND ` + sqlClaimable + `
     ORDER BY revision, event_id LIMIT 100
  )
  SELECT event_id::text, history_table, revision,
         ` + sqlSetAsideInterval + `,
         pg_try_advisory_lock(hashtext($2), hashtext(event_id::text))
    FROM candidates ORDER BY candidates.revision, candidates.event_id`

const sqlCandidatesAfter = `AND (revision, event_id) > ($4::bigint, $5::uuid)`

// sqlUnlockClaims releases every claim lock of the session.
const sqlUnlockClaims = `SELECT pg_advisory_unlock_all()`

// Claim is a claimed batch of pending events: they stay marked as taken
// until Finish or Release, so concurrent drains take disjoint batches.
// The caller must call one of them (a claim with no events and nothing
// unpublishable has already let its session go; both are then no-ops).
type Claim struct {
	Batch
	// Unpublishable are claimed events the store found it cannot publish:
	// their history row is gone, their table has no capture trigger, or
	// their capture is malformed. Pass them to Finish to set them aside.
	Unpublishable []SetAside

	store  *Store
	target Target
	conn   *pgxpool.Conn // the claim's session; nil on the legacy path
	locked bool          // the session may hold claim locks
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
}

// ClaimActive reads the replication state and, when replication is enabled
// and has an active target, claims the next batch of its pending events:
// the state, the target and the first candidates in one round trip, the
// events in a second. The claim is nil when there is nothing to drain
// (replication disabled, or no active target: the error is
// ErrNoActiveTarget). On a legacy database it reads the SDK's scan.
func (s *Store) ClaimActive(ctx context.Context) (State, Target, *Claim, error) {
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
	b := &pgx.Batch{}
	b.Queue(sqlClaimSession, ms(s.cfg.StatementTimeout), ms(s.cfg.LockTimeout), ms(s.cfg.ClaimIdleTimeout), LifecycleLock)
	if legacyHint {
		b.Queue(sqlSchemaPresent)
	}
	// At protocol 4 the schema check is the state read itself: without the
	// singleton it cannot be prepared (undefined_table, handled below).
	b.Queue(sqlState)
	if !legacyHint {
		b.Queue(sqlActiveTargetV4)
		c.locked = true
		b.Queue(fmt.Sprintf(sqlCandidates, ""), nil, ClaimLockClass, s.backoffs)
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
		return state, Target{}, nil, err
	}
	rows, err := results.Query()
	if err != nil {
		return state, t, nil, err
	}
	cands, err := collectCandidates(rows, backoffs)
	return state, t, cands, err
}

// candidates reads and try-locks the next page of candidates after the
// given one (nil: from the start), in one round trip that also sets the
// session's timeouts.
func (c *Claim) candidates(ctx context.Context, generation string, after *candidate) ([]candidate, error) {
	s := c.store
	b := &pgx.Batch{}
	b.Queue(sqlClaimSession, ms(s.cfg.StatementTimeout), ms(s.cfg.LockTimeout), ms(s.cfg.ClaimIdleTimeout), LifecycleLock)
	if after == nil {
		b.Queue(fmt.Sprintf(sqlCandidates, ""), generation, ClaimLockClass, s.backoffs)
	} else {
		b.Queue(fmt.Sprintf(sqlCandidates, sqlCandidatesAfter), generation, ClaimLockClass, s.backoffs, after.revision, after.id)
	}
	c.locked = true
	results := c.conn.SendBatch(ctx, b)
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
	return cands, err
}

// collectCandidates reads sqlCandidates: every candidate, with claimed
// ones marked (the others are held by other drains), and the backoff of
// those last set aside (an interval that is one of backoffs).
func collectCandidates(rows pgx.Rows, backoffs []int64) ([]candidate, error) {
	cands := make([]candidate, 0, claimPageSize)
	var cd candidate
	var interval *int64
	_, err := pgx.ForEachRow(rows, []any{&cd.id, &cd.table, &cd.revision, &interval, &cd.claimed}, func() error {
		cd.backoff = 0
		if interval != nil && slices.Contains(backoffs, *interval) {
			cd.backoff = time.Duration(*interval) * time.Microsecond
		}
		cands = append(cands, cd)
		return nil
	})
	return cands, err
}

// fill completes a claim from the first page of candidates: it reads more
// pages while other drains hold most of them, keeps the rows still pending,
// reads their events and bounds the batch.
func (c *Claim) fill(ctx context.Context, page []candidate) error {
	s := c.store
	var claimed []candidate
	more := false
	for pages := 1; ; pages++ {
		for _, cd := range page {
			if cd.claimed {
				claimed = append(claimed, cd)
			}
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
		last := page[len(page)-1]
		var err error
		if page, err = c.candidates(ctx, c.target.Generation, &last); err != nil {
			return err
		}
	}
	if len(claimed) > claimPageSize {
		more = true
		claimed = claimed[:claimPageSize] // the rest stay locked until the claim ends
	}
	if len(claimed) == 0 {
		c.locked = false // no try-lock succeeded
		c.More = more
		c.Release(ctx) // nothing to finish: the session goes back at once
		return nil
	}
	for _, cd := range claimed {
		if cd.backoff > 0 {
			if c.backoffs == nil {
				c.backoffs = map[string]time.Duration{}
			}
			c.backoffs[cd.id] = cd.backoff
		}
	}
	items, aside, err := s.readEvents(ctx, c.conn, c.target, claimed)
	if err != nil {
		return err
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

// undefinedTable reports PostgreSQL's undefined_table (42P01).
func undefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}
