package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The drain's turns, which coalesce a busy workspace's claims: see Turns
// in the package doc. A Session takes them (Session.QueueTurn), and its
// next claim lets them go.

// DrainTurnClass names the first key of the drain turn's advisory locks.
const DrainTurnClass = "segmentstream.ontology.replication.drain-turn"

// The second keys of the turn's locks.
const (
	turnDrain = 1 // the turn: its holder's claim statement runs
	turnNext  = 2 // the next turn: its holder gathers, then claims
)

// sqlQueueTurn takes the next turn ($1: DrainTurnClass) or, when another
// session holds it, waits for it in the server, at most the lock_timeout
// it sets first ($2; see waitBound); it then tries the turn as well, and
// says what it holds (3: both, 2: the next turn only), how long it waited
// for the next turn (microseconds; NULL when it did not wait), and the
// session's idle_session_timeout before it, which it sets to $3
// (Config.IdleTimeout: a holder that freezes is ended by the server). The
// locks are taken in order: the subquery that takes the next turn is kept
// apart (OFFSET 0), and its wait is a SubPlan the server runs only when
// CASE reaches its branch. It never waits for the turn: the claim does,
// after its gathering (sqlClaimSessionTakingTurn), when it is still held.
// A statement that fails (its wait timed out, or its session was ended)
// leaves no setting: the setting is rolled back with the statement's
// implicit transaction; a lock it took is not, and the caller lets it go
// (sqlLeaveTurns).
var sqlQueueTurn = `SELECT CASE WHEN pg_try_advisory_lock(hashtext($1), 1) THEN 3 ELSE 2 END, q.waited, q.prior,
       set_config('idle_session_timeout', $3, false)
  FROM (SELECT bound.prior, CASE WHEN pg_try_advisory_lock(hashtext($1), 2) THEN NULL ELSE (
           SELECT (extract(epoch FROM clock_timestamp() - bound.at) * 1000000)::bigint FROM pg_advisory_lock(hashtext($1), 2)) END AS waited
          FROM ` + sqlWaitBound + ` OFFSET 0) q`

// sqlReleaseTurn lets the turn go ($1: DrainTurnClass) after a claim's
// candidates, whose try-locks then hold its events: the turn is never held
// across a publish.
const sqlReleaseTurn = `SELECT pg_advisory_unlock(hashtext($1), 1)`

// sqlLeaveTurns lets whichever of the turn and the next turn the session
// holds go ($1: DrainTurnClass), and none of its other locks (the claims
// of its batches out stay held).
const sqlLeaveTurns = `SELECT count(pg_advisory_unlock(hashtext($1), l.objid::int)) FROM pg_locks l
  WHERE l.pid = pg_backend_pid() AND l.locktype = 'advisory' AND l.granted
    AND l.classid::int = hashtext($1) AND l.objsubid = 2 AND l.objid::bigint IN (1, 2)`

// sqlWaitBound is waitBound of $2.
var sqlWaitBound = waitBound("$2")

// waitBound is the FROM item that bounds a turn's waits: a row computed
// before the statement's target list, and so before any of its locks,
// which sets the lock_timeout (the parameter) for the statement (local to
// its implicit transaction), says when it began (at) and reads the
// session's idle_session_timeout (prior). It saves the statement a
// separate set_config sent before it.
func waitBound(param string) string {
	return `(SELECT set_config('lock_timeout', ` + param + `, true), clock_timestamp() AS at,
      current_setting('idle_session_timeout') AS prior OFFSET 0) bound`
}

// ErrTurnWait: the session that holds the turn (or the next turn) held it
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

// holdsTurn reports whether conn's session holds the drain's turn after a
// claim's first statement timed out on a lock (if not, it waited for the
// turn, not the lifecycle lock); yes when it cannot tell.
func holdsTurn(ctx context.Context, conn *pgxpool.Conn) bool {
	var held bool
	err := conn.QueryRow(ctx, sqlHoldsTurn, DrainTurnClass).Scan(&held)
	return err != nil || held
}

// QueueTurn takes the workspace's next turn on the session's connection
// (taking one when the session has none), waiting in the server for the
// session that holds it, at most bound (longer fails with ErrTurnWait), in
// one statement; it takes the turn too when that is free. It returns how
// long it waited. The session's next claim (Next) then takes the turn when
// it does not hold it yet, waiting at most bound for the claim that holds
// it, lets the next turn go before its candidates are read, and lets the
// turn go after them: the turn is held for a claim's statements only, the
// next turn by one session of the workspace at a time, which may gather
// commits before its claim while the sessions that want the next turn
// after it wait in the server. So the drainers of every process claim one
// after another, each after the commits of every wake-up it answered.
// LeaveTurn lets the turns go without a claim.
func (ss *Session) QueueTurn(ctx context.Context, bound time.Duration) (time.Duration, error) {
	if ss.closed {
		return 0, ErrSessionClosed
	}
	if ss.nextHeld {
		return 0, nil
	}
	if err := ss.connect(ctx); err != nil {
		return 0, fmt.Errorf("store: wait for the drain's turn: %w", err)
	}
	var role int
	var waited *int64
	var prior string
	err := awaitBounded(ctx, ss.conn, bound, sqlQueueTurn, []any{ms(ss.store.cfg.IdleTimeout)}, &role, &waited, &prior, nil)
	ss.used = time.Now()
	if err != nil {
		// The statement may have taken the next turn before it failed.
		ss.nextHeld, ss.turnHeld = true, true
		ss.LeaveTurn(ctx)
		if errors.Is(err, ErrTurnWait) {
			return 0, fmt.Errorf("store: wait for the drain's turn: %w", err)
		}
		return 0, fmt.Errorf("store: take the drain's turn: %w", err)
	}
	if ss.idlePrior == nil {
		ss.idlePrior = &prior
	}
	ss.armed, ss.nextHeld, ss.turnHeld, ss.turnBound = true, true, role == 3, bound
	var d time.Duration
	if waited != nil {
		d = time.Duration(*waited) * time.Microsecond
	}
	return d, nil
}

// HoldsNext reports whether the session holds the next turn (QueueTurn)
// and has not claimed on it yet.
func (ss *Session) HoldsNext() bool { return ss.nextHeld }

// LeaveTurn lets the turn and the next turn go, if the session holds them,
// without claiming; the claims out stay held. A failure leaves the session
// dirty (Close then closes its connection, which frees every lock).
func (ss *Session) LeaveTurn(ctx context.Context) {
	if !ss.nextHeld && !ss.turnHeld {
		return
	}
	ss.nextHeld, ss.turnHeld = false, false
	if ss.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ss.store.cfg.StatementTimeout)
	defer cancel()
	if _, err := ss.conn.Exec(ctx, sqlLeaveTurns, DrainTurnClass); err != nil {
		ss.dirty = true
	}
	ss.used = time.Now()
}

// turnWaitOrLock tells, after a turn claim's first statement failed on a
// lock timeout, a wait for the turn (ErrTurnWait) from one for the
// lifecycle lock.
func (ss *Session) turnWaitOrLock(ctx context.Context, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && isLockTimeout(err) && !holdsTurn(ctx, ss.conn) {
		return fmt.Errorf("%w (%v): %w", ErrTurnWait, ss.turnBound, err)
	}
	return err
}
