package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The drain's turn, coalescing a workspace's wake-ups: see Turns in the
// package doc.

// DrainTurnClass names the first key of the drain turn's advisory locks.
const DrainTurnClass = "segmentstream.ontology.replication.drain-turn"

// The second keys of the turn's locks.
const (
	turnDrain = 1 // the turn: its holder drains
	turnNext  = 2 // the next turn: its holder waits for the turn
)

// TurnRole is what a wake-up's TakeTurn gave it.
type TurnRole int

// The roles.
const (
	// TurnCoalesced: another drain holds the next turn and has not claimed
	// yet; its claim takes this wake-up's events.
	TurnCoalesced TurnRole = iota
	// TurnTaken: the wake-up holds the turn (and the next turn): it may
	// claim at once.
	TurnTaken
	// TurnNext: the wake-up holds the next turn while another drain holds
	// the turn; its claim waits for the turn.
	TurnNext
)

// sqlTakeTurn takes the next turn if it is free and, with it, the turn if
// that is free too ($1: DrainTurnClass), in that order (CASE evaluates its
// branches lazily), and says what it took: 0 nothing (another drain is
// next), 2 the next turn, 3 both. The turn is never taken without the next
// turn: a drain that holds the next turn and gathers commits before its
// claim (see delivery.Service.Drain) may leave the turn free meanwhile, and
// no other drain claims ahead of it. When it took something it sets the
// session's idle_session_timeout to $2 (Config.TurnIdleTimeout: a holder
// that freezes is ended by the server), and it returns the setting's value
// before, which the turn's end puts back.
const sqlTakeTurn = `SELECT t.role, CASE WHEN t.role > 0 THEN set_config('idle_session_timeout', $2, false) END, p.prior
  FROM (SELECT current_setting('idle_session_timeout') AS prior OFFSET 0) p,
       (SELECT CASE WHEN pg_try_advisory_lock(hashtext($1), 2)
          THEN CASE WHEN pg_try_advisory_lock(hashtext($1), 1) THEN 3 ELSE 2 END ELSE 0 END AS role OFFSET 0) t`

// sqlQueueTurn is sqlTakeTurn that, when the next turn is held, waits for
// it in the server instead of taking nothing, at most the lock_timeout it
// sets first ($2; see waitBound); it then tries the turn as well, and says
// what it holds (2 or 3), how long it waited for the next turn
// (microseconds; NULL when it did not wait), and the session's
// idle_session_timeout before it, which it sets to $3 (as sqlTakeTurn).
// The locks are taken in order: the subquery that takes the next turn is
// kept apart (OFFSET 0), and its wait is a SubPlan the server runs only
// when CASE reaches its branch. It never waits for the turn: the drain's
// claim does, after its gathering (sqlClaimSessionTakingTurn), when it is
// still held. A statement that fails (its wait timed out, or its session
// was ended) leaves no setting: the session's setting is rolled back with
// the statement's implicit transaction.
var sqlQueueTurn = `SELECT CASE WHEN pg_try_advisory_lock(hashtext($1), 1) THEN 3 ELSE 2 END, q.waited, q.prior,
       set_config('idle_session_timeout', $3, false)
  FROM (SELECT bound.prior, CASE WHEN pg_try_advisory_lock(hashtext($1), 2) THEN NULL ELSE (
           SELECT (extract(epoch FROM clock_timestamp() - bound.at) * 1000000)::bigint FROM pg_advisory_lock(hashtext($1), 2)) END AS waited
          FROM ` + sqlWaitBound + ` OFFSET 0) q`

// sqlWaitBound is waitBound of $2.
var sqlWaitBound = waitBound("$2")

// waitBound is the FROM item that bounds a turn's waits: a row computed
// before the statement's target list, and so before any of its locks,
// which sets the lock_timeout (the parameter) for the statement (local to
// its implicit transaction), says when it began (at) and reads the
// session's idle_session_timeout (prior). It saves the statement a
// separate set_config sent before it (one statement fewer for each drain
// that claims).
func waitBound(param string) string {
	return `(SELECT set_config('lock_timeout', ` + param + `, true), clock_timestamp() AS at,
      current_setting('idle_session_timeout') AS prior OFFSET 0) bound`
}

// Turn is a wake-up's place in its workspace's turns: it holds a
// connection of the store's pool while it holds the next turn or the turn.
type Turn struct {
	store *Store
	conn  *pgxpool.Conn
	role  TurnRole
	next  bool // it holds the next turn: it has not claimed yet
	// bound bounds its claim's wait for the turn (TurnNext).
	bound time.Duration
	// queued: QueueTurn waited for the next turn; waited is how long it
	// waited for the next turn and then, in its claim, for the turn.
	queued bool
	waited time.Duration
	// idlePrior is the session's idle_session_timeout before the turn's
	// statement set it (Config.TurnIdleTimeout): End and the claim's
	// release put it back.
	idlePrior string
}

// TakeTurn takes the workspace's next turn and, if it is free too, the
// drain turn, in one statement; or nothing, when another drain is next. A
// Turn of role TurnCoalesced holds nothing; the others must be claimed
// with (Claim) or ended (End). The claim of a TurnNext waits for the turn
// at most bound (longer fails with ErrTurnWait).
func (s *Store) TakeTurn(ctx context.Context, bound time.Duration) (*Turn, error) {
	return s.takeTurn(ctx, false, bound)
}

// QueueTurn is TakeTurn for a drain that must claim, as the first drain of
// its process to wait for the workspace's turn (see delivery.Service.Drain),
// in one statement too: when another drain is next it waits for the next
// turn instead of taking nothing, at most bound (longer fails with
// ErrTurnWait). It returns holding the next turn, and the turn when that
// was free (TurnTaken; TurnNext otherwise: its claim waits for the turn, at
// most bound). Its process's later wake-ups are coalesced into it without
// a statement until its claim, and so a busy workspace costs the database
// a statement per drain that claims, not one per wake-up.
func (s *Store) QueueTurn(ctx context.Context, bound time.Duration) (*Turn, error) {
	return s.takeTurn(ctx, true, bound)
}

// takeTurn is TakeTurn, or with queue QueueTurn.
func (s *Store) takeTurn(ctx context.Context, queue bool, bound time.Duration) (*Turn, error) {
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: take the drain's turn: %w", err)
	}
	t := &Turn{store: s, conn: conn, bound: bound}
	var role int
	if queue {
		var waited *int64
		err = awaitBounded(ctx, conn, bound, sqlQueueTurn, []any{ms(s.cfg.TurnIdleTimeout)}, &role, &waited, &t.idlePrior, nil)
		if waited != nil {
			t.queued, t.waited = true, time.Duration(*waited)*time.Microsecond
		}
	} else {
		err = conn.QueryRow(ctx, sqlTakeTurn, DrainTurnClass, ms(s.cfg.TurnIdleTimeout)).Scan(&role, nil, &t.idlePrior)
	}
	if err != nil {
		// The statement may have taken a lock before it failed; its
		// setting was rolled back with it.
		t.idlePrior = ""
		t.End(ctx)
		if errors.Is(err, ErrTurnWait) {
			return nil, fmt.Errorf("store: wait for the drain's turn: %w", err)
		}
		return nil, fmt.Errorf("store: take the drain's turn: %w", err)
	}
	switch role {
	case 3:
		t.role, t.next = TurnTaken, true
	case 2:
		t.role, t.next = TurnNext, true
	default:
		t.role = TurnCoalesced
		conn.Release() // it took nothing and set nothing
		t.conn = nil
	}
	return t, nil
}

// Role is what TakeTurn gave the wake-up.
func (t *Turn) Role() TurnRole { return t.role }

// Queued reports that QueueTurn waited for the next turn.
func (t *Turn) Queued() bool { return t.queued }

// Waited is how long the drain waited, measured by the server, for the
// next turn (QueueTurn) and, once its claim was made, for the turn
// (Turn.Claim).
func (t *Turn) Waited() time.Duration { return t.waited }

// HoldsNext reports that the drain holds the next turn: the wake-ups that
// come until its claim are coalesced into it, so it may wait a moment
// before it claims to gather more commits into one batch.
func (t *Turn) HoldsNext() bool { return t.next }

// ErrTurnWait: the drain that holds the turn (or the next turn) held it
// longer than the wait's bound.
var ErrTurnWait = errors.New("the drain's turn was held longer than the wait's bound")

// awaitBounded runs a turn's statement that may wait in the server for a
// lock of the turns ($1: DrainTurnClass), at most bound (the statement's
// $2: see waitBound), with more arguments after them, and scans its row
// into dest; a wait past the bound is ErrTurnWait.
func awaitBounded(ctx context.Context, conn *pgxpool.Conn, bound time.Duration, query string, more []any, dest ...any) error {
	err := conn.QueryRow(ctx, query, append([]any{DrainTurnClass, ms(bound)}, more...)...).Scan(dest...)
	if isLockTimeout(err) {
		return fmt.Errorf("%w (%v): %w", ErrTurnWait, bound, err)
	}
	return err
}

// Claim claims the next batch of the active target's pending events on
// the turn's connection, as ClaimActive does. Its first statement takes
// the turn when the drain does not hold it yet (TurnNext), waiting at most
// the turn's bound (longer fails with ErrTurnWait), and then lets the next
// turn go, before the candidates are read; the claim takes the turn over,
// and its Finish or Release ends it (with every lock of the session).
func (t *Turn) Claim(ctx context.Context) (State, Target, *Claim, error) {
	if t.role == TurnCoalesced || t.conn == nil {
		return State{}, Target{}, nil, errors.New("store: claim on the drain's turn: neither the turn nor the next turn is held")
	}
	conn := t.conn
	t.conn = nil
	prior := t.idlePrior
	hold := turnHold{turn: t.role == TurnTaken, next: t.next, waited: &t.waited, idlePrior: &prior}
	if !hold.turn {
		hold.take, hold.bound = true, t.bound
	}
	state, target, c, err := t.store.claimActive(ctx, conn, hold)
	if undefinedTable(err) {
		// A read table was renamed: the statement never ran, and the
		// claim's release ended the turn. Claim again without it: the claim
		// still starts after every wake-up that counted on this turn.
		t.store.forgetCaptureTables()
		return t.store.ClaimActive(ctx)
	}
	return state, target, c, err
}

// End gives the turn (or the wait for it) up without claiming: the
// session's locks are released, its idle_session_timeout is put back, and
// the connection goes back to the pool (or is closed when that fails). It
// is safe to call more than once.
func (t *Turn) End(ctx context.Context) {
	if t.conn == nil {
		return
	}
	conn := t.conn
	t.conn = nil
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.store.cfg.StatementTimeout)
	defer cancel()
	var err error
	if t.idlePrior != "" {
		_, err = conn.Exec(ctx, sqlUnlockRestore, t.idlePrior)
	} else {
		_, err = conn.Exec(ctx, sqlUnlockAll)
	}
	if err != nil {
		_ = conn.Conn().Close(ctx)
	}
	conn.Release()
}

// isLockTimeout reports PostgreSQL's lock_not_available (55P03).
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// sqlHoldsTurn reports whether the session holds the drain's turn ($1:
// DrainTurnClass): a two-key advisory lock is (classid, objid) with
// objsubid 2.
const sqlHoldsTurn = `SELECT EXISTS (SELECT FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND granted
    AND classid::int = hashtext($1) AND objid::bigint = 1 AND objsubid = 2)`

// holdsTurn reports whether the claim's session holds the drain's turn,
// after its first statement failed on a lock timeout: if not, the timeout
// was the wait for the turn's, not the lifecycle lock's. It says yes when
// it cannot tell.
func (c *Claim) holdsTurn(ctx context.Context) bool {
	var held bool
	err := c.conn.QueryRow(ctx, sqlHoldsTurn, DrainTurnClass).Scan(&held)
	return err != nil || held
}
