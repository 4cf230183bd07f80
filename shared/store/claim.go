package store

// A claim's start and end on its connection; its design (the locking every
// change must keep) is Claims in the package doc, its session's first
// statement and unlock claimsession.go, its candidates candidates.go, its
// events read read.go, its acknowledgement finish.go.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ClaimLockClass names the first key of the claim's advisory locks.
const ClaimLockClass = "segmentstream.ontology.replication.claim"

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
	// Held is how many pending rows the claim's read found held by other
	// claims (their sessions' claim locks), which it left to them. A claim
	// whose session is ending, or whose process froze, still holds them
	// until the server has ended it (see delivery.Service.Drain).
	Held int

	store  *Store
	target Target
	mode   claimMode
	// conn is the claim's own session (ownSession) until the claim ends.
	conn *pgxpool.Conn
	// session is the Session whose claim it is (inSession).
	session *Session
	out     bool // a Session's claim, neither finished nor released
	// legacyEnded: a legacy claim was finished or released.
	legacyEnded bool
	locked      bool // the claim may hold claim locks (or the drain's turn)
	turn        bool // the claim's session holds the drain's turn
	// idlePrior is the session's idle_session_timeout before the claim
	// (nil: not read), which its release puts back.
	idlePrior *string
	// alive keeps the claim's own session alive while its batch is out
	// (see keepAlive); nil when it holds none.
	alive *keepAlive
	keys  []int32 // the keys of the claim locks it took (a Session's claims)
	// locks are the candidates a Session's claim locked, until its fill
	// has trimmed them (see trim).
	locks []candidate
	last  *candidate
	// limit is the last page's limit (pageLimit): a page that long is
	// full, and more may follow it.
	limit int
	// outIDs are the rows the session's other claims out carry, while
	// the claim is filled (carriedOut).
	outIDs map[string]bool
	// backoffs are the claimed rows' last set-aside backoffs, by history id
	// (those set aside before only).
	backoffs map[string]time.Duration
}

// claimMode is where a claim's statements run and how it ends, chosen once
// when the claim is made.
type claimMode uint8

const (
	// ownSession is ClaimActive's claim at protocol 4: it holds a
	// connection of its own, whose claim locks Finish or Release lets go
	// before the connection goes back to the pool.
	ownSession claimMode = iota
	// inSession is a Session's claim: its statements run on the session's
	// connection, which outlives it; the session acknowledges it.
	inSession
	// legacyScan is a protocol 3 claim: the SDK's scan locks nothing, so
	// it holds no connection; Finish writes its receipts.
	legacyScan
)

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
	for attempt := 0; ; attempt++ {
		conn, err := s.db.Acquire(ctx)
		if err != nil {
			return State{}, Target{}, nil, fmt.Errorf("store: claim pending events: %w", err)
		}
		state, t, c, err := s.claimActive(ctx, conn)
		if attempt == 0 && undefinedTable(err) {
			s.forgetCaptureTables()
			continue
		}
		c.keepAlive()
		return state, t, c, err
	}
}

// Reserved is a connection of the store's pool set apart for one claim
// (ClaimActive), or given back (Release).
type Reserved struct {
	store *Store
	conn  *pgxpool.Conn
}

// Reserve sets a connection of the store's pool apart, waiting at most
// wait for one.
func (s *Store) Reserve(ctx context.Context, wait time.Duration) (*Reserved, error) {
	actx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	conn, err := s.db.Acquire(actx)
	if err != nil {
		return nil, fmt.Errorf("store: reserve a connection: %w", err)
	}
	return &Reserved{store: s, conn: conn}, nil
}

// ClaimActive is Store.ClaimActive on the reserved connection, which the
// claim takes over.
func (r *Reserved) ClaimActive(ctx context.Context) (State, Target, *Claim, error) {
	if r.conn == nil {
		return State{}, Target{}, nil, errors.New("store: claim on a reserved connection: it was used or released")
	}
	conn := r.conn
	r.conn = nil
	state, t, c, err := r.store.claimActive(ctx, conn)
	if undefinedTable(err) {
		r.store.forgetCaptureTables()
		return r.store.ClaimActive(ctx)
	}
	c.keepAlive()
	return state, t, c, err
}

// Release gives the connection back, unless a claim took it over.
func (r *Reserved) Release() {
	if r.conn != nil {
		r.conn.Release()
		r.conn = nil
	}
}

// claimActive is one attempt of ClaimActive on conn, which the claim takes
// over (and gives back to the pool when it ends).
func (s *Store) claimActive(ctx context.Context, conn *pgxpool.Conn) (State, Target, *Claim, error) {
	fail := func(err error) (State, Target, *Claim, error) {
		return State{}, Target{}, nil, fmt.Errorf("store: claim pending events: %w", err)
	}
	c := &Claim{store: s, conn: conn}
	keep := false
	defer func() {
		if !keep {
			c.Release(ctx)
		}
	}()
	legacyHint := s.legacy.Load()
	b, err := s.queueClaimStart(ctx, c, legacyHint)
	if err != nil {
		return fail(err)
	}
	results := conn.SendBatch(ctx, b)
	state, t, cands, err := readClaimStart(c, results, !legacyHint, s.backoffs)
	if cerr := results.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if state, err = s.settleProtocol(ctx, c, state, err); err != nil {
		return state, Target{}, nil, err
	}
	if state.Version < ProtocolDelivery {
		keep = true // the legacy claim takes the session over (see claimLegacy)
		if c.conn != nil && c.conn.Conn().PgConn().TxStatus() != 'I' {
			c.Release(ctx)
		}
		return s.claimLegacy(ctx, c)
	}
	s.legacy.Store(false)
	if legacyHint {
		// Read as a legacy database last time: read the target and the
		// candidates now.
		if t, cands, err = s.claimAfterLegacyHint(ctx, c, state); err != nil || !state.Enabled {
			return state, t, nil, err
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

// queueClaimStart queues ClaimActive's first round trip: the session's
// settings and the shared lifecycle lock, and the state with, at protocol
// 4, the active target (sqlClaimState) and the candidates' statement.
func (s *Store) queueClaimStart(ctx context.Context, c *Claim, legacyHint bool) (*pgx.Batch, error) {
	var read readTables
	if !legacyHint {
		var err error
		if read, err = s.readTables(ctx, c.conn); err != nil {
			return nil, err
		}
	}
	b := &pgx.Batch{}
	b.Queue(sqlClaimSession, ms(s.cfg.StatementTimeout), ms(s.cfg.LockTimeout), LifecycleLock)
	if legacyHint {
		b.Queue(sqlSchemaPresent)
		b.Queue(sqlState)
		return b, nil
	}
	// At protocol 4 the schema check is the state read itself: without the
	// singleton it cannot be prepared (undefined_table, handled in
	// settleProtocol).
	b.Queue(sqlClaimState)
	c.locked = true
	c.limit = s.queueCandidates(b, nil, read, nil, nil, s.cfg.IdleTimeout)
	return b, nil
}

// settleProtocol tells, from the first round trip's error, the database's
// protocol: it returns the state (read again when nothing could run) and
// the error to return, if any, remembering a legacy database.
func (s *Store) settleProtocol(ctx context.Context, c *Claim, state State, err error) (State, error) {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return state, nil
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
			return State{}, fmt.Errorf("store: claim pending events: %w", err)
		}
		if state.Version == ProtocolDelivery {
			return State{}, fmt.Errorf("store: claim pending events: %w", pgErr)
		}
		s.legacy.Store(true)
		return state, nil
	case errors.As(err, &pgErr) && pgErr.Code == "42703" && state.Version > 0 && state.Version < ProtocolDelivery:
		// The same, found while running.
		s.legacy.Store(true)
		return state, nil
	case errors.Is(err, ErrNoActiveTarget) && state.Version == ProtocolDelivery:
		return state, fmt.Errorf("store: read active target: %w", ErrNoActiveTarget)
	}
	return State{}, fmt.Errorf("store: claim pending events: %w", err)
}

// claimAfterLegacyHint reads the active target and the candidates of a
// database read as legacy last time and at protocol 4 now, on the claim's
// own session: a second connection from the pool could wait forever behind
// claims that each hold one. No candidates while replication is disabled.
func (s *Store) claimAfterLegacyHint(ctx context.Context, c *Claim, state State) (Target, []candidate, error) {
	if state.ActiveGeneration == "" {
		return Target{}, nil, fmt.Errorf("store: read active target: %w", ErrNoActiveTarget)
	}
	t, err := scanTarget(c.conn.QueryRow(ctx, sqlTargetV4, state.ActiveGeneration))
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return Target{}, nil, fmt.Errorf("store: read active target: %w", ErrNoActiveTarget)
		}
		return Target{}, nil, fmt.Errorf("store: claim pending events: %w", err)
	}
	if !state.Enabled {
		return t, nil, nil
	}
	cands, err := c.candidates(ctx, t.Generation, nil)
	if err != nil {
		return Target{}, nil, fmt.Errorf("store: claim pending events: %w", err)
	}
	return t, cands, nil
}

// readClaimStart reads the results of ClaimActive's first round trip.
func readClaimStart(c *Claim, results pgx.BatchResults, v4 bool, backoffs []int64) (State, Target, []candidate, error) {
	prior, _, err := readClaimSession(results, turnHold{})
	if err != nil {
		return State{}, Target{}, nil, err
	}
	c.idlePrior = &prior
	if !v4 {
		var present bool
		if err := results.QueryRow().Scan(&present); err != nil {
			return State{}, Target{}, nil, err
		}
		if !present {
			return State{}, Target{}, nil, ErrNoSchema
		}
		state, err := readStateRow(results.QueryRow())
		return state, Target{}, nil, err
	}
	state, t, err := readClaimState(results.QueryRow())
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

// ownKeys are the claim locks a page of the claim passes over: its own
// (taken by its earlier pages) and, a Session's claim, those of the
// session's other claims out.
func (c *Claim) ownKeys() []int32 {
	keys := slices.Clone(c.keys)
	if c.mode == inSession {
		keys = append(keys, c.session.ownKeys(c)...)
	}
	return keys
}

// db is the connection the claim's statements run on.
func (c *Claim) db() *pgxpool.Conn {
	if c.mode == inSession {
		return c.session.conn
	}
	return c.conn
}

// Release ends the claim without acknowledging anything: its events stay
// pending and other drains may take them at once. It is safe to call after
// Finish, and more than once.
func (c *Claim) Release(ctx context.Context) {
	if c == nil {
		return
	}
	c.stopAlive()
	switch {
	case c.mode == inSession:
		c.session.release(ctx, c)
		return
	case c.mode == legacyScan:
		c.legacyEnded = true
		if c.conn == nil {
			return
		}
	case c.conn == nil:
		return
	}
	conn := c.conn
	c.conn = nil
	if c.store.beforeRelease != nil {
		c.store.beforeRelease()
	}
	if c.locked || conn.Conn().PgConn().TxStatus() != 'I' {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.store.cfg.StatementTimeout)
		defer cancel()
		err := func() error {
			if conn.Conn().PgConn().TxStatus() != 'I' {
				if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
					return err
				}
			}
			return unlock(ctx, conn, c.idlePrior)
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

// Target is the target the claim's events belong to.
func (c *Claim) Target() Target { return c.target }

// Ended reports whether the claim has been finished or released.
func (c *Claim) Ended() bool {
	switch c.mode {
	case inSession:
		return !c.out
	case legacyScan:
		return c.legacyEnded
	}
	return c.conn == nil
}
