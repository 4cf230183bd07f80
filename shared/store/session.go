package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Session is a drain's session: one connection on which a drain claims
// batch after batch of the active target's pending events, several out at
// once, and finishes each after its publish. One round trip (Next)
// finishes the claims whose publishes have ended, in one short transaction,
// releases their locks after its COMMIT and claims the next batch. The
// job's bulk drain runs on one session, however many batches it has out,
// so that it holds one connection and its claims never meet each other;
// the drain function's one batch a wake-up claims on a connection of its
// own (ClaimActive). A Session is used by one goroutine at a time.
type Session struct {
	store  *Store
	conn   *pgxpool.Conn
	target Target
	// after is the last candidate the last claim read: while claims are
	// out, the next claim starts after it, so that it never meets the
	// session's own claims (a try-lock of a lock the session holds
	// succeeds); with none out, it starts at the head of the queue, where
	// events left behind (held by other drains, sent back to pending) are.
	after *candidate
	out   int // claims out: neither finished nor released
	// dirty: a claim failed midway and the session may hold claim locks
	// no claim knows; Close releases them all.
	dirty bool
	// armed: a claim of the session took a lock, which set the session's
	// idle_session_timeout; giveBack puts idlePrior back (what it was
	// before the session's first claim).
	armed     bool
	idlePrior *string
	closed    bool
}

// ErrSessionClosed is the error of a Session's methods after Close.
var ErrSessionClosed = errors.New("store: the drain session is closed")

// sqlUnlockKeys releases a session's claim locks of the given keys ($2,
// each taken once), after the COMMIT that acknowledged their events; it
// returns how many it released.
const sqlUnlockKeys = `SELECT count(*) FROM unnest($2::int4[]) AS k WHERE pg_advisory_unlock(hashtext($1), k)`

// OpenSession reads the replication state and the active target and, when
// replication is enabled at protocol 4, opens a drain session on a
// connection of its own, to be closed with Close. The session is nil
// otherwise: replication disabled or a legacy database (claim with
// ClaimActive), or no active target (the error is ErrNoActiveTarget).
func (s *Store) OpenSession(ctx context.Context) (State, Target, *Session, error) {
	fail := func(err error) (State, Target, *Session, error) {
		return State{}, Target{}, nil, fmt.Errorf("store: open a drain session: %w", err)
	}
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return fail(err)
	}
	ss := &Session{store: s, conn: conn}
	keep := false
	defer func() {
		if !keep {
			ss.Close(ctx)
		}
	}()
	var state State
	err = s.inTxOnce(ctx, conn, false, func(tx pgx.Tx) error {
		var err error
		if state, err = readStateRow(tx.QueryRow(ctx, sqlState)); err != nil || state.Version < ProtocolDelivery || !state.Enabled {
			return err
		}
		if state.ActiveGeneration == "" {
			return ErrNoActiveTarget
		}
		ss.target, err = scanTarget(tx.QueryRow(ctx, sqlTargetV4, state.ActiveGeneration))
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNoActiveTarget
		}
		return err
	})
	switch {
	case undefinedTable(err):
		return fail(ErrNoSchema)
	case err != nil:
		return fail(err)
	case state.Version < ProtocolDelivery || !state.Enabled:
		return state, ss.target, nil, nil
	}
	keep = true
	return state, ss.target, ss, nil
}

// Target is the target the session drains.
func (ss *Session) Target() Target { return ss.target }

// Out is how many of the session's claims are out.
func (ss *Session) Out() int { return ss.out }

// Finishing is one of a session's claims to finish: the events Pub/Sub
// accepted are acknowledged, those that cannot be published set aside (see
// Claim.Finish); the claim's other events stay pending. With neither, the
// claim is released.
type Finishing struct {
	Claim    *Claim
	Accepted []string
	SetAside []SetAside
}

// Next finishes the given claims of the session and then, with claim,
// claims the next batch, in one round trip (events of tables the claim's
// statement does not read yet take a second): the finished claims'
// acknowledgements and set-asides in one short transaction, as Finish's
// (the shared lifecycle lock, then every row in key order), their locks
// released after its COMMIT, then the claim. It returns the receipts
// written, the replication state read with the claim and the claim (nil
// without claim). Nothing is claimed when replication is disabled or
// another generation is active (see the state), or when nothing is
// claimable after the session's last claim while claims are out: finish
// them and claim again, from the head of the queue. When the finish fails
// its claims stay out, still claimed.
//
// When a history table the claim's statement reads has gone (an entity
// renamed: undefined_table), the statement failed before it locked a row;
// the capture tables are looked up again and the claims still out are
// finished and the claim made once more.
func (ss *Session) Next(ctx context.Context, finish []Finishing, claim bool) (int64, State, *Claim, error) {
	receipts, state, c, err := ss.next(ctx, finish, claim)
	if !claim || !undefinedTable(err) || ss.closed {
		return receipts, state, c, err
	}
	ss.store.forgetCaptureTables()
	var still []Finishing
	for _, f := range finish {
		if f.Claim.out {
			still = append(still, f)
		}
	}
	more, state, c, err := ss.next(ctx, still, claim)
	return receipts + more, state, c, err
}

// next is one attempt of Next.
func (ss *Session) next(ctx context.Context, finish []Finishing, claim bool) (int64, State, *Claim, error) {
	t := ss.target
	if ss.closed {
		return 0, State{}, nil, ErrSessionClosed
	}
	if ss.conn == nil { // idle: take a connection again
		conn, err := ss.store.db.Acquire(ctx)
		if err != nil {
			return 0, State{}, nil, fmt.Errorf("store: claim pending events of %s: %w", t.Generation, err)
		}
		ss.conn = conn
	}
	r, err := ss.newRound(finish, claim)
	if err != nil {
		return 0, State{}, nil, err
	}
	b, err := ss.queueRound(ctx, r)
	if err != nil || len(b.QueuedQueries) == 0 {
		return 0, State{}, nil, err
	}
	if err := ss.sendRound(ctx, b, r); err != nil {
		return r.receipts, r.state, nil, err
	}
	if !claim {
		return r.receipts, r.state, nil, nil
	}
	c, err := ss.claimFrom(ctx, r.state, r.cands)
	return r.receipts, r.state, c, err
}

// round is one round trip of Next: the claims it finishes and whether it
// claims, and what it read back.
type round struct {
	finish          []Finishing
	claim           bool
	accepted, aside []string
	backoffs        []int64
	keys            []int32 // the finished claims' locks

	receipts int64
	state    State
	cands    []candidate
}

// ack reports whether the round acknowledges or sets aside anything.
func (r *round) ack() bool { return len(r.accepted)+len(r.aside) > 0 }

// newRound gathers what the claims to finish accepted and set aside.
func (ss *Session) newRound(finish []Finishing, claim bool) (*round, error) {
	r := &round{finish: finish, claim: claim}
	for _, f := range finish {
		if f.Claim.session != ss || !f.Claim.out {
			return nil, errors.New("store: a claim to finish is not out in this session")
		}
		r.accepted = append(r.accepted, f.Accepted...)
		for _, a := range f.SetAside {
			r.aside = append(r.aside, a.HistoryID)
			r.backoffs = append(r.backoffs, ss.store.nextBackoff(f.Claim.priorBackoff(a.HistoryID)).Microseconds()+reasonTag(a))
		}
		r.keys = append(r.keys, f.Claim.keys...)
	}
	return r, nil
}

// queueRound queues the round's statements: the acknowledgement's
// transaction, the release of the finished claims' locks, and the claim.
func (ss *Session) queueRound(ctx context.Context, r *round) (*pgx.Batch, error) {
	s, t := ss.store, ss.target
	b := &pgx.Batch{}
	if r.ack() {
		query, args, err := finishStatement(t.Generation, r.accepted, r.aside, r.backoffs)
		if err != nil {
			return nil, fmt.Errorf("store: acknowledge %d events of %s: %w", len(r.accepted), t.Generation, err)
		}
		queueAcknowledgement(b, s.cfg, query, args)
	}
	if len(r.keys) > 0 {
		b.Queue(sqlUnlockKeys, ClaimLockClass, r.keys)
	}
	if r.claim {
		read, err := s.readTables(ctx, ss.conn)
		if err != nil {
			return nil, fmt.Errorf("store: claim pending events of %s: %w", t.Generation, err)
		}
		b.Queue(sqlClaimSession, ms(s.cfg.StatementTimeout), ms(s.cfg.LockTimeout), LifecycleLock)
		b.Queue(sqlState)
		after := ss.after
		if ss.out == len(r.finish) {
			after = nil // none out once these are finished: from the head
		}
		s.queueCandidates(b, t.Generation, read, after, s.cfg.ClaimIdleTimeout)
	}
	return b, nil
}

// sendRound sends the round and reads what it returns; a failure after
// the claim's statement began leaves the session dirty (it may hold locks
// no claim knows).
func (ss *Session) sendRound(ctx context.Context, b *pgx.Batch, r *round) error {
	results := ss.conn.SendBatch(ctx, b)
	stage, claiming := "acknowledge", false
	err := func() error {
		if r.ack() {
			receipts, err := readAcknowledgement(results)
			if err != nil {
				return err
			}
			if len(r.accepted) > 0 {
				r.receipts = receipts
			}
		}
		// Committed (or nothing to commit): the claims are finished.
		for _, f := range r.finish {
			f.Claim.locked, f.Claim.out = false, false
			ss.out--
		}
		if len(r.keys) > 0 {
			stage = "release the claims of"
			var released int
			if err := results.QueryRow().Scan(&released); err != nil {
				ss.dirty = true
				return err
			}
			if released != len(r.keys) {
				ss.dirty = true // locks a claim took twice, or lost: Close releases every one
			}
		}
		if !r.claim {
			return nil
		}
		stage = "claim pending events of"
		prior, _, err := readClaimSession(results, turnHold{})
		if err != nil {
			return err
		}
		if ss.idlePrior == nil {
			ss.idlePrior = &prior
		}
		if r.state, err = readStateRow(results.QueryRow()); err != nil {
			return err
		}
		// The statement's try-locks are the session's from here on: when it
		// fails, the session may hold some that no claim knows, and its
		// idle_session_timeout may be set.
		claiming, ss.armed = true, true
		rows, err := results.Query()
		if err != nil {
			return err
		}
		r.cands, err = collectCandidates(rows, ss.store.backoffs)
		return err
	}()
	if cerr := results.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err == nil {
		return nil
	}
	if claiming {
		ss.dirty = true
	}
	if ss.conn.Conn().PgConn().TxStatus() != 'I' {
		_, _ = ss.conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
	}
	return fmt.Errorf("store: %s %s: %w", stage, ss.target.Generation, err)
}

// claimFrom makes the round's claim from the candidates its statement
// read: none while replication is paused or another generation is active.
func (ss *Session) claimFrom(ctx context.Context, state State, cands []candidate) (*Claim, error) {
	c := &Claim{store: ss.store, target: ss.target, mode: inSession, session: ss, locked: true, out: true}
	ss.out++
	if !state.Enabled || state.ActiveGeneration != ss.target.Generation {
		// Paused, or another generation made active, as the claim ran:
		// nothing of this one is published.
		for _, cd := range cands {
			if cd.claimed {
				c.keys = append(c.keys, cd.key)
			}
		}
		c.Release(ctx)
		return nil, nil
	}
	if err := c.fill(ctx, cands); err != nil {
		// A follow-on page or the second read failed: the session may hold
		// locks of it that the claim does not know.
		if c.out {
			c.locked, c.out = false, false
			ss.out--
		}
		ss.dirty = true
		return nil, fmt.Errorf("store: claim pending events of %s: %w", ss.target.Generation, err)
	}
	if c.last != nil {
		ss.after = c.last
	}
	return c, nil
}

// release ends a claim of the session without acknowledging anything: its
// locks are released at once.
func (ss *Session) release(ctx context.Context, c *Claim) {
	if !c.out {
		return
	}
	if ss.closed {
		c.locked, c.out = false, false // its locks went with the session
		return
	}
	if len(c.keys) == 0 {
		c.locked, c.out = false, false
		ss.out--
		return
	}
	if _, _, _, err := ss.Next(ctx, []Finishing{{Claim: c}}, false); err != nil && c.out {
		// The claim's locks stay with the session until Close.
		c.locked, c.out = false, false
		ss.out--
		ss.dirty = true
	}
}

// Idle gives the session's connection back to the pool while none of its
// claims is out, so that other work on the workspace (a replay's pages,
// through a pool of one connection) can take it; the next Next takes one
// again. With claims out it does nothing.
func (ss *Session) Idle(ctx context.Context) {
	if ss.out > 0 || ss.conn == nil {
		return
	}
	ss.giveBack(ctx)
}

// Close ends the session: the claims still out are released (their events
// stay pending), and the connection goes back to the pool once it holds no
// claim lock; it is closed otherwise, which frees them. It is safe to call
// more than once.
func (ss *Session) Close(ctx context.Context) {
	ss.closed = true
	ss.giveBack(ctx)
}

// giveBack releases the session's claim locks and gives its connection
// back to the pool (closing it when the locks may not have gone).
func (ss *Session) giveBack(ctx context.Context) {
	if ss.conn == nil {
		return
	}
	conn := ss.conn
	ss.conn = nil
	defer func() { ss.out, ss.dirty, ss.armed = 0, false, false }()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ss.store.cfg.StatementTimeout)
	defer cancel()
	err := func() error {
		if conn.Conn().PgConn().TxStatus() != 'I' {
			if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
				return err
			}
		}
		if ss.out > 0 || ss.dirty || ss.armed {
			return unlock(ctx, conn, ss.idlePrior)
		}
		return nil
	}()
	if err != nil {
		_ = conn.Conn().Close(ctx)
	}
	conn.Release()
}
