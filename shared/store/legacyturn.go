package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// A protocol-3 claim holds its workspace's drain turn (see Turns in the
// package doc) from its scan to its end. The SDK's legacy scan locks
// nothing: two drains that scanned at once would publish the same events.
// So a legacy claim is made on a session that takes the turn first,
// waiting at most legacyTurnWait, reads the scan, acknowledges the
// receipts and lets the turn go when the claim ends: one drain of a
// protocol-3 database at a time, wherever it runs. Its session is kept
// alive while its batch is out (keepAlive), like any claim's.

// legacyTurnWait bounds a legacy claim's wait for the turn: a holder keeps
// it for one batch, and a frozen one is ended after Config.IdleTimeout.
// Longer fails with ErrTurnWait.
const legacyTurnWait = 20 * time.Second

// sqlLegacyTurn takes the drain's turn ($1: DrainTurnClass), waiting at
// most $2 (see waitBound), sets the session's idle_session_timeout to $3
// (Config.IdleTimeout) and returns what it was.
var sqlLegacyTurn = `SELECT l.prior, set_config('idle_session_timeout', $3, false)
  FROM (SELECT bound.prior, pg_advisory_lock(hashtext($1), 1) FROM ` + sqlWaitBound + ` OFFSET 0) l`

// claimLegacy makes the protocol-3 claim of c, a claim whose first round
// trip found the database at protocol 3, on c's session (or another, when
// c's went back to the pool), which takes the turn first. The legacy claim
// takes the session over; Finish or Release ends it.
func (s *Store) claimLegacy(ctx context.Context, c *Claim) (State, Target, *Claim, error) {
	conn, prior := c.conn, c.idlePrior
	c.conn = nil
	if conn == nil {
		var err error
		if conn, err = s.db.Acquire(ctx); err != nil {
			return State{}, Target{}, nil, fmt.Errorf("store: claim pending events: %w", err)
		}
	}
	lc := &Claim{store: s, mode: legacyScan, conn: conn, locked: true, turn: true, idlePrior: prior}
	keep := false
	defer func() {
		if !keep {
			lc.Release(ctx)
		}
	}()
	var before string
	if err := awaitBounded(ctx, conn, legacyTurnWait, sqlLegacyTurn, []any{ms(s.cfg.IdleTimeout)}, &before, nil); err != nil {
		return State{}, Target{}, nil, fmt.Errorf("store: wait for the drain's turn (protocol 3): %w", err)
	}
	if lc.idlePrior == nil {
		lc.idlePrior = &before
	}
	var state State
	var t Target
	err := s.inTxOnce(ctx, conn, false, func(tx pgx.Tx) error {
		var err error
		if state, t, err = activeTargetIn(ctx, tx); err != nil || !state.Enabled {
			return err
		}
		lc.target = t
		lc.Batch, lc.Unpublishable, err = s.legacyPending(ctx, tx, t, s.legacyAside.excluded(time.Now()))
		return err
	})
	if err != nil {
		return state, Target{}, nil, fmt.Errorf("store: claim pending events of %s: %w", t.Generation, err)
	}
	if !state.Enabled {
		return state, t, nil, nil
	}
	if len(lc.Events) > 0 || len(lc.Unpublishable) > 0 {
		keep = true
	} else {
		lc.Release(ctx)
		keep = true // a claim with nothing to publish has ended already
	}
	return state, t, lc, nil
}
