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
	// TurnCoalesced: another drain holds the turn and a third waits for
	// it; that one's claim takes this wake-up's events.
	TurnCoalesced TurnRole = iota
	// TurnTaken: the wake-up holds the turn: it claims now.
	TurnTaken
	// TurnNext: the wake-up waits for the turn (Turn.Wait), then claims.
	TurnNext
)

// sqlTakeTurn tries the turn and, with it, the next turn; or else the next
// turn alone ($1: DrainTurnClass), in that order (CASE evaluates its
// branches lazily), and says what it took: 0 neither, 1 the turn, 2 the
// next turn, 3 both.
const sqlTakeTurn = `SELECT CASE WHEN pg_try_advisory_lock(hashtext($1), 1)
    THEN CASE WHEN pg_try_advisory_lock(hashtext($1), 2) THEN 3 ELSE 1 END
  WHEN pg_try_advisory_lock(hashtext($1), 2) THEN 2 ELSE 0 END`

// sqlQueueTurn is sqlTakeTurn that then waits, in the server, for what it
// must hold to claim: when both turns are held it waits for the next turn
// (and says 4) instead of taking nothing, and when it holds the next turn
// without the turn (2 or 4) it waits for the turn, each wait at most the
// lock_timeout it sets first ($2; see sqlWaitBound). It also says how long
// it waited for the turn once it held the next turn (microseconds; NULL
// when it did not wait), which the drain's gathering counts (see
// delivery.Service.Drain). The locks are taken in order: the subqueries
// are kept apart (OFFSET 0), the wait for the next turn is an InitPlan the
// server runs only when CASE reaches its branch, and the wait for the turn
// a SubPlan run on the row that holds the next turn, when it must.
const sqlQueueTurn = `SELECT r.role, CASE WHEN r.role IN (2, 4) THEN (
         SELECT (extract(epoch FROM clock_timestamp() - r.at) * 1000000)::bigint FROM pg_advisory_lock(hashtext($1), 1)) END
  FROM (SELECT q.role, clock_timestamp() AS at FROM (
         SELECT CASE WHEN pg_try_advisory_lock(hashtext($1), 1)
             THEN CASE WHEN pg_try_advisory_lock(hashtext($1), 2) THEN 3 ELSE 1 END
           WHEN pg_try_advisory_lock(hashtext($1), 2) THEN 2
           ELSE (SELECT 4 FROM pg_advisory_lock(hashtext($1), 2)) END AS role
           FROM ` + sqlWaitBound + ` OFFSET 0) q OFFSET 0) r`

// sqlWaitBound is the FROM item that bounds a turn's waits: a row computed
// before the statement's target list, and so before any of its locks,
// which sets the lock_timeout ($2) for the statement (local to its
// implicit transaction). It saves the statement a separate set_config
// sent before it (one statement fewer for each drain that claims).
const sqlWaitBound = `(SELECT set_config('lock_timeout', $2, true) OFFSET 0) bound`

// sqlAwaitTurn waits for the turn ($1: DrainTurnClass), at most the
// lock_timeout ($2) it sets first. sqlLeaveNext lets the next turn go,
// before a claim.
const (
	sqlAwaitTurn = `SELECT pg_advisory_lock(hashtext($1), 1) FROM ` + sqlWaitBound
	sqlLeaveNext = `SELECT pg_advisory_unlock(hashtext($1), 2)`
)

// Turn is a wake-up's place in its workspace's turns: it holds a
// connection of the store's pool while it holds the turn or waits for it.
type Turn struct {
	store *Store
	conn  *pgxpool.Conn
	role  TurnRole
	next  bool // it holds the next turn: it has not claimed yet
	// queued: QueueTurn waited for the next turn or for the turn;
	// waited is how long it waited for the turn once it held the next.
	queued bool
	waited time.Duration
}

// TakeTurn takes the workspace's drain turn, or the next turn, or neither,
// in one statement. A Turn of role TurnCoalesced holds nothing; the others
// must be claimed with (Claim) or ended (End).
func (s *Store) TakeTurn(ctx context.Context) (*Turn, error) {
	return s.takeTurn(ctx, false, 0)
}

// QueueTurn is TakeTurn for a drain that must claim, as the first drain of
// its process to wait for the workspace's turn (see delivery.Service.Drain),
// in one statement too: when another drain holds the turn and a third the
// next turn, it waits for the next turn instead of taking nothing, and once
// it holds the next turn it waits for the turn, each wait at most bound
// (longer fails with ErrTurnWait). It returns holding the turn (TurnTaken),
// with the next turn unless it found the turn free and the next turn held.
// Its process's later wake-ups are coalesced into it without a statement
// until its claim, and so a busy workspace costs the database a statement
// per drain that claims, not one per wake-up.
func (s *Store) QueueTurn(ctx context.Context, bound time.Duration) (*Turn, error) {
	return s.takeTurn(ctx, true, bound)
}

// takeTurn is TakeTurn, or with queue QueueTurn.
func (s *Store) takeTurn(ctx context.Context, queue bool, bound time.Duration) (*Turn, error) {
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: take the drain's turn: %w", err)
	}
	t := &Turn{store: s, conn: conn}
	var role int
	if queue {
		var waited *int64
		err = awaitBounded(ctx, conn, bound, sqlQueueTurn, &role, &waited)
		if waited != nil {
			t.queued, t.waited = true, time.Duration(*waited)*time.Microsecond
		}
	} else {
		err = conn.QueryRow(ctx, sqlTakeTurn, DrainTurnClass).Scan(&role)
	}
	if err != nil {
		t.End(ctx) // the statement may have taken a lock before it failed
		if errors.Is(err, ErrTurnWait) {
			return nil, fmt.Errorf("store: wait for the drain's turn: %w", err)
		}
		return nil, fmt.Errorf("store: take the drain's turn: %w", err)
	}
	t.role, t.next = TurnRole(role), role >= 2
	if role == 3 || queue && role != 0 { // QueueTurn returns holding the turn
		t.role = TurnTaken
	}
	if t.role == TurnCoalesced {
		conn.Release()
		t.conn = nil
	}
	return t, nil
}

// Role is what TakeTurn gave the wake-up.
func (t *Turn) Role() TurnRole { return t.role }

// Queued reports that QueueTurn held the next turn and so waited for the
// turn (and, before, for the next turn if it was held).
func (t *Turn) Queued() bool { return t.queued }

// Waited is how long QueueTurn waited for the turn once it held the next
// turn, measured by the server.
func (t *Turn) Waited() time.Duration { return t.waited }

// HoldsNext reports that the drain holds the next turn as well as, or
// while it waits for, the turn: the wake-ups that come until its claim are
// coalesced into it, so it may wait a moment before it claims to gather
// more commits into one batch.
func (t *Turn) HoldsNext() bool { return t.next }

// ErrTurnWait: the drain that holds the turn held it longer than the wait's
// bound.
var ErrTurnWait = errors.New("the drain's turn was held longer than the wait's bound")

// Wait waits, at most bound, for the turn a TurnNext wake-up is next for;
// it keeps the next turn until its claim. On error the turn is ended.
func (t *Turn) Wait(ctx context.Context, bound time.Duration) error {
	if t.role != TurnNext || t.conn == nil {
		return errors.New("store: wait for the drain's turn: not next")
	}
	if err := awaitBounded(ctx, t.conn, bound, sqlAwaitTurn); err != nil {
		t.End(ctx)
		return fmt.Errorf("store: wait for the drain's turn: %w", err)
	}
	t.role = TurnTaken
	return nil
}

// awaitBounded runs a turn's statement that may wait in the server for a
// lock of the turns ($1: DrainTurnClass), at most bound (the statement's
// $2: see sqlWaitBound). It scans the statement's row into dest, if any; a
// wait past the bound is ErrTurnWait.
func awaitBounded(ctx context.Context, conn *pgxpool.Conn, bound time.Duration, query string, dest ...any) error {
	var err error
	if len(dest) > 0 {
		err = conn.QueryRow(ctx, query, DrainTurnClass, ms(bound)).Scan(dest...)
	} else {
		_, err = conn.Exec(ctx, query, DrainTurnClass, ms(bound))
	}
	if isLockTimeout(err) {
		return fmt.Errorf("%w (%v): %w", ErrTurnWait, bound, err)
	}
	return err
}

// Claim claims the next batch of the active target's pending events on
// the turn's connection, as ClaimActive does, letting the next turn go
// first when it holds it; the claim takes the turn over, and its Finish or
// Release ends it (with every lock of the session).
// The turn must have been taken (TurnTaken, or TurnNext after Wait).
func (t *Turn) Claim(ctx context.Context) (State, Target, *Claim, error) {
	if t.role != TurnTaken || t.conn == nil {
		return State{}, Target{}, nil, errors.New("store: claim on the drain's turn: the turn is not held")
	}
	conn := t.conn
	t.conn = nil
	state, target, c, err := t.store.claimActive(ctx, conn, turnHold{turn: true, next: t.next})
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
// session's locks are released and the connection goes back to the pool
// (or is closed when the unlock fails). It is safe to call more than once.
func (t *Turn) End(ctx context.Context) {
	if t.conn == nil {
		return
	}
	conn := t.conn
	t.conn = nil
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.store.cfg.StatementTimeout)
	defer cancel()
	if _, err := conn.Exec(ctx, sqlUnlockAll); err != nil {
		_ = conn.Conn().Close(ctx)
	}
	conn.Release()
}

// isLockTimeout reports PostgreSQL's lock_not_available (55P03).
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}
