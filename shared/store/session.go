package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Session is a drain's session: one connection on which a drain claims
// batch after batch of the active target's pending events, several out at
// once, and finishes each after its publish. One round trip (Next)
// finishes the claims whose publishes have ended and claims the next
// batch. Both the drain function's drainer and the job's bulk drain run on
// one session, however many batches they have out, so that each holds one
// connection and its claims never meet each other. A busy drainer takes
// the workspace's turns on it (QueueTurn), so that the drainers of every
// process claim one at a time. A Session is used by one goroutine at a
// time.
type Session struct {
	store  *Store
	conn   *pgxpool.Conn
	target Target // the target it drains: OpenSession's, or its first claim's
	// claims are the session's claims, those out among them. Each claim
	// starts at the head of the queue, where events left behind (held by
	// other drains, released by a failed publish, sent back to pending)
	// are, and passes over the rows of the claims out (their locks are the
	// session's: a try-lock of them would succeed).
	claims []*Claim
	out    int // claims out: neither finished nor released
	// spare are the keys of locks its claims took but carry no row of
	// (see Claim.trim): its next round trip lets them go first.
	spare []int32
	// dirty: a claim failed midway and the session may hold claim locks
	// no claim knows; Close releases them all.
	dirty bool
	// armed: a lock of the session set its idle_session_timeout; giveBack
	// puts idlePrior back (what it was before the session's first lock).
	armed     bool
	idlePrior *string
	closed    bool
	// next and turn: the session holds the next turn, and the turn too
	// (QueueTurn); its next claim takes the turn when it does not hold it,
	// waiting at most turnBound, and lets both go.
	nextHeld, turnHeld bool
	turnBound          time.Duration
	// used is when the session's last statement ended (see Touch).
	used time.Time
}

// ErrSessionClosed is the error of a Session's methods after Close.
var ErrSessionClosed = errors.New("store: the drain session is closed")

// ErrLegacyDatabase: the database is at protocol 3, which has no delivery
// queue for a session's claims: claim with ClaimActive.
var ErrLegacyDatabase = errors.New("the database is at protocol 3, which has no delivery queue for a session")

// NewSession returns a drain session that has not touched the database:
// its first Next takes a connection and reads the state and the active
// target with its claim, in the claim's own round trip, so that a drainer
// that claims once costs what a claim costs. A database at protocol 3
// fails that Next with ErrLegacyDatabase.
func (s *Store) NewSession() *Session { return &Session{store: s} }

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
// released after its COMMIT, then the claim; or, when they are the
// session's last claims out and nothing follows, in the implicit
// transaction of Finish's shape, which lets every lock go just before it
// commits (three statements where the other takes five). It returns the
// receipts written, the replication state read with the claim and the
// claim (nil without claim). Nothing is claimed when replication is
// disabled or another generation is active (see the state; no active
// target is ErrNoActiveTarget), or when nothing is claimable after the
// session's last claim while claims are out: finish them and claim again,
// from the head of the queue. When the finish fails its claims stay out,
// still claimed. A session that holds the next turn (QueueTurn) claims on
// its turn: see QueueTurn.
//
// When a history table the claim's statement reads has gone (an entity
// renamed: undefined_table), the statement failed before it locked a row;
// the capture tables are looked up again and the claims still out are
// finished and the claim made once more.
func (ss *Session) Next(ctx context.Context, finish []Finishing, claim bool) (int64, State, *Claim, error) {
	receipts, state, c, err := ss.next(ctx, finish, claim)
	if !claim || !undefinedTable(err) || ss.closed || state.Version != 0 {
		return receipts, state, c, err
	}
	// Nothing of the round ran: a table it names is not there.
	if legacy, lerr := ss.legacy(ctx); lerr == nil && legacy {
		return receipts, state, nil, fmt.Errorf("store: claim pending events: %w", ErrLegacyDatabase)
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

// legacy reports, after a round that could not be prepared, whether the
// database is at protocol 3 (which has no delivery table), remembering it.
func (ss *Session) legacy(ctx context.Context) (bool, error) {
	state, err := readStateRow(ss.conn.QueryRow(ctx, sqlState))
	ss.used = time.Now()
	if err != nil {
		return false, err
	}
	if state.Version < ProtocolDelivery {
		ss.store.legacy.Store(true)
		return true, nil
	}
	return false, nil
}

// next is one attempt of Next.
func (ss *Session) next(ctx context.Context, finish []Finishing, claim bool) (int64, State, *Claim, error) {
	if ss.closed {
		return 0, State{}, nil, ErrSessionClosed
	}
	if err := ss.connect(ctx); err != nil {
		return 0, State{}, nil, fmt.Errorf("store: claim pending events of %s: %w", ss.target.Generation, err)
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
	if r.targetErr != nil {
		return r.receipts, r.state, nil, fmt.Errorf("store: claim pending events: %w", r.targetErr)
	}
	c, err := ss.claimFrom(ctx, r.state, r.target, r.cands, r.limit)
	return r.receipts, r.state, c, err
}

// connect takes a connection for the session when it has none (new, or
// idle: see Idle).
func (ss *Session) connect(ctx context.Context) error {
	if ss.conn != nil {
		return nil
	}
	conn, err := ss.store.db.Acquire(ctx)
	if err != nil {
		return err
	}
	ss.conn = conn
	return nil
}

// claimFrom makes the round's claim from the candidates its statement
// read: none while replication is paused or another generation is active.
func (ss *Session) claimFrom(ctx context.Context, state State, active Target, cands []candidate, limit int) (*Claim, error) {
	if ss.target.Generation == "" {
		ss.target = active
	}
	c := &Claim{store: ss.store, target: ss.target, mode: inSession, session: ss, locked: true, out: true, limit: limit}
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
	ss.claims = append(ss.claims, c)
	return c, nil
}

// ownKeys are the keys of the claim locks of the session's claims out but
// those in except (claims the round finishes, whose locks go before its
// claim), which a claim passes over.
func (ss *Session) ownKeys(except ...*Claim) []int32 {
	var keys []int32
	live := ss.claims[:0]
	for _, c := range ss.claims {
		if !c.out {
			continue
		}
		live = append(live, c)
		if !slices.Contains(except, c) {
			keys = append(keys, c.keys...)
		}
	}
	clear(ss.claims[len(live):])
	ss.claims = live
	return keys
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
// claims is out and it holds no turn, so that other work on the workspace
// (a replay's pages, through a pool of one connection) can take it; the
// next Next takes one again. Otherwise it does nothing.
func (ss *Session) Idle(ctx context.Context) {
	if ss.out > 0 || ss.nextHeld || ss.turnHeld || len(ss.spare) > 0 || ss.conn == nil {
		return
	}
	ss.giveBack(ctx)
}

// Close ends the session: the claims still out are released (their events
// stay pending), a turn it holds is let go, and the connection goes back to
// the pool once it holds no lock; it is closed otherwise, which frees them.
// It is safe to call more than once.
func (ss *Session) Close(ctx context.Context) {
	ss.closed = true
	ss.giveBack(ctx)
}

// giveBack releases the session's locks and gives its connection back to
// the pool (closing it when the locks may not have gone).
func (ss *Session) giveBack(ctx context.Context) {
	if ss.conn == nil {
		return
	}
	conn := ss.conn
	ss.conn = nil
	defer func() {
		ss.out, ss.dirty, ss.armed, ss.nextHeld, ss.turnHeld, ss.spare, ss.claims = 0, false, false, false, false, nil, nil
	}()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ss.store.cfg.StatementTimeout)
	defer cancel()
	err := func() error {
		if conn.Conn().PgConn().TxStatus() != 'I' {
			if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
				return err
			}
		}
		if ss.out > 0 || ss.dirty || ss.armed || ss.nextHeld || ss.turnHeld {
			return unlock(ctx, conn, ss.idlePrior)
		}
		return nil
	}()
	if err != nil {
		_ = conn.Conn().Close(ctx)
	}
	conn.Release()
}

// Dirty reports that the session may hold locks no claim of it knows (a
// claim failed midway) or lost its connection: close it, which frees them,
// and start another.
func (ss *Session) Dirty() bool {
	return ss.dirty || (ss.conn != nil && ss.conn.Conn().IsClosed())
}
