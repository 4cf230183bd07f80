package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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

// sqlAwaitTurn waits for the turn ($1: DrainTurnClass), at most the
// lock_timeout sqlAwaitTurnBound sets before it in the same implicit
// transaction. sqlLeaveNext lets the next turn go, before a claim.
const (
	sqlAwaitTurnBound = `SELECT set_config('lock_timeout', $1, true)`
	sqlAwaitTurn      = `SELECT pg_advisory_lock(hashtext($1), 1)`
	sqlLeaveNext      = `SELECT pg_advisory_unlock(hashtext($1), 2)`
)

// Turn is a wake-up's place in its workspace's turns: it holds a
// connection of the store's pool while it holds the turn or waits for it.
type Turn struct {
	store *Store
	conn  *pgxpool.Conn
	role  TurnRole
	next  bool // it holds the next turn: it has not claimed yet
	local bool // coalesced in the process, without a statement
}

// TakeTurn takes the workspace's drain turn, or the next turn, or neither,
// in one statement. A Turn of role TurnCoalesced holds nothing; the others
// must be claimed with (Claim) or ended (End).
//
// The caller may know of a drain of its own process that comes to wait for
// the turn (it has not claimed yet, so its claim takes this wake-up's
// events): when coalesced is closed while TakeTurn still waits for a
// connection of the pool, it gives up the wait and returns TurnCoalesced,
// having sent nothing. It may be nil.
func (s *Store) TakeTurn(ctx context.Context, coalesced <-chan struct{}) (*Turn, error) {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	if coalesced != nil {
		go func() {
			select {
			case <-coalesced:
				cancel()
			case <-actx.Done():
			}
		}()
	}
	conn, err := s.db.Acquire(actx)
	if err != nil {
		if ctx.Err() == nil && actx.Err() != nil {
			return &Turn{store: s, role: TurnCoalesced, local: true}, nil
		}
		return nil, fmt.Errorf("store: take the drain's turn: %w", err)
	}
	t := &Turn{store: s, conn: conn}
	var role int
	if err := conn.QueryRow(ctx, sqlTakeTurn, DrainTurnClass).Scan(&role); err != nil {
		t.End(ctx) // the statement may have taken a lock before it failed
		return nil, fmt.Errorf("store: take the drain's turn: %w", err)
	}
	t.role, t.next = TurnRole(role), role >= 2
	if role == 3 {
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

// HoldsNext reports that the drain holds the next turn as well as, or
// while it waits for, the turn: the wake-ups that come until its claim are
// coalesced into it, so it may wait a moment before it claims to gather
// more commits into one batch.
func (t *Turn) HoldsNext() bool { return t.next }

// Local reports a TurnCoalesced that TakeTurn gave without a statement (the
// caller's coalesced channel was closed first).
func (t *Turn) Local() bool { return t.local }

// ErrTurnWait: the drain that holds the turn held it longer than the wait's
// bound.
var ErrTurnWait = errors.New("the drain's turn was held longer than the wait's bound")

// Wait waits, at most bound, for the turn a TurnNext wake-up is next for;
// it keeps the next turn until its claim. On error the turn is ended.
func (t *Turn) Wait(ctx context.Context, bound time.Duration) error {
	if t.role != TurnNext || t.conn == nil {
		return errors.New("store: wait for the drain's turn: not next")
	}
	b := &pgx.Batch{}
	b.Queue(sqlAwaitTurnBound, ms(bound))
	b.Queue(sqlAwaitTurn, DrainTurnClass)
	if err := t.conn.SendBatch(ctx, b).Close(); err != nil {
		t.End(ctx)
		if isLockTimeout(err) {
			return fmt.Errorf("store: wait for the drain's turn: %w (%v): %w", ErrTurnWait, bound, err)
		}
		return fmt.Errorf("store: wait for the drain's turn: %w", err)
	}
	t.role = TurnTaken
	return nil
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
