package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The end of a claim: its accepted events acknowledged and those that
// cannot be published set aside, in one short transaction (Finish).

// sqlBeginShared is sqlSetKeyOrder and the shared lifecycle lock
// (shareReplicationLifecycle, seed 000) in one statement.
const sqlBeginShared = `SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true),
  set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
  pg_advisory_xact_lock_shared(hashtextextended($3, 0))`

// Finish ends the claim: it acknowledges the accepted events (history ids
// of events Pub/Sub accepted: call it only after the publish succeeded for
// them) and sets aside those that cannot be published, in one short
// transaction that takes the shared lifecycle lock first, as the seed's
// acknowledgement does, and then updates every row of the batch in one
// statement, in key order (sqlFinish); then it releases the claim. Events in neither list
// stay pending. It returns the number of receipts written.
//
// A claim of its own session (ClaimActive) sends all of it as
// one implicit transaction, one round trip: the lifecycle lock, the finish
// statement and the unlock, without BEGIN and COMMIT (two statements fewer
// a batch on the wake-up path). Its claim locks, and the drain's turn, are
// then let go just before the acknowledgement commits rather than just
// after: a claim that try-locks one of its events in between finds the
// row locked by the uncommitted update and skips it (the candidates'
// statement locks a row it read in an older version FOR NO KEY UPDATE SKIP
// LOCKED, and once the update has committed, finds it accepted), so no
// event is taken twice; TestFinishLetsGoBeforeItsCommit holds it. When the
// transaction fails, nothing is acknowledged and Release lets the locks go.
func (c *Claim) Finish(ctx context.Context, accepted []string, setAside []SetAside) (int64, error) {
	c.stopAlive()
	if c.Ended() {
		if c.mode != inSession && len(accepted) == 0 && len(setAside) == 0 {
			return 0, nil // nothing to acknowledge (a claim that took no event has ended already: see Claim)
		}
		return 0, fmt.Errorf("store: acknowledge %d events of %s: the claim has ended", len(accepted), c.target.Generation)
	}
	switch c.mode {
	case inSession:
		n, _, _, err := c.session.Next(ctx, []Finishing{{Claim: c, Accepted: accepted, SetAside: setAside}}, false)
		return n, err
	case legacyScan:
		defer c.Release(ctx) // the turn the claim held
		return c.finishLegacy(ctx, accepted, setAside)
	}
	defer c.Release(ctx)
	if len(accepted) == 0 && len(setAside) == 0 {
		return 0, nil
	}
	s, t := c.store, c.target
	fail := func(err error) (int64, error) {
		return 0, fmt.Errorf("store: acknowledge %d events of %s: %w", len(accepted), t.Generation, err)
	}
	aside := make([]string, len(setAside))
	backoffs := make([]int64, len(setAside))
	for i, a := range setAside {
		aside[i] = a.HistoryID
		backoffs[i] = s.nextBackoff(c.priorBackoff(a.HistoryID)).Microseconds() + reasonTag(a)
	}
	query, args, err := finishStatement(t.Generation, accepted, aside, backoffs)
	if err != nil {
		return fail(err)
	}
	// One implicit transaction (see above): no BEGIN, no COMMIT; the
	// finish statement second.
	const finishPlace = 1
	b := &pgx.Batch{}
	queueShareLifecycle(b, s.cfg)
	b.Queue(query, args...)
	if c.idlePrior != nil {
		b.Queue(sqlUnlockRestore, *c.idlePrior)
	} else {
		b.Queue(sqlUnlockAll)
		b.Queue(sqlResetIdle)
	}
	results := c.conn.SendBatch(ctx, b)
	var acked int64
	err = func() error {
		for i := range b.QueuedQueries {
			tag, err := results.Exec()
			if err != nil {
				return err
			}
			if i == finishPlace && len(accepted) > 0 {
				acked = tag.RowsAffected()
			}
		}
		return nil
	}()
	if cerr := results.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	c.locked = false
	return acked, nil
}

// A Session's acknowledgement's transaction, one round trip with what
// follows it: BEGIN, the shared lifecycle lock with the store's timeouts,
// the finish statement (finishStatement), COMMIT. Session.Next sends it
// (Finish sends the same without BEGIN and COMMIT); readAcknowledgement
// reads it back.
const (
	acknowledgementStatements = 4
	acknowledgementFinish     = 2 // the finish statement's place
)

// queueShareLifecycle queues sqlBeginShared with the store's timeouts: the
// first statement of every acknowledgement's transaction.
func queueShareLifecycle(b *pgx.Batch, cfg Config) {
	b.Queue(sqlBeginShared, ms(cfg.StatementTimeout), ms(cfg.LockTimeout), LifecycleLock)
}

// queueAcknowledgement queues the acknowledgement's transaction.
func queueAcknowledgement(b *pgx.Batch, cfg Config, query string, args []any) {
	b.Queue("BEGIN")
	queueShareLifecycle(b, cfg)
	b.Queue(query, args...)
	b.Queue("COMMIT")
}

// readAcknowledgement reads the acknowledgement's transaction and returns
// the rows its finish statement wrote (the receipts, when it accepted
// events).
func readAcknowledgement(results pgx.BatchResults) (int64, error) {
	var written int64
	for step := range acknowledgementStatements {
		tag, err := results.Exec()
		if err != nil {
			return 0, err
		}
		if step == acknowledgementFinish {
			written = tag.RowsAffected()
		}
	}
	return written, nil
}

// finishStatement returns the statement that acknowledges the accepted
// events and sets aside the others (each with its next backoff, in
// microseconds), updating every row of the batch in one statement, so that
// its locks are taken in one key order (see sqlFinish): the seed-shaped
// statement alone when the batch has one kind of row, as it is cheaper.
func finishStatement(generation string, accepted, aside []string, backoffs []int64) (string, []any, error) {
	switch {
	case len(aside) == 0:
		list, err := uuids(accepted)
		return sqlAcknowledge, []any{generation, list}, err
	case len(accepted) == 0:
		list, err := uuids(aside)
		return sqlSetAside, []any{generation, list, backoffs}, err
	}
	list, err := uuids(append(append(make([]string, 0, len(accepted)+len(aside)), accepted...), aside...))
	all := make([]*int64, len(accepted), len(accepted)+len(aside))
	for i := range backoffs {
		all = append(all, &backoffs[i])
	}
	return sqlFinish, []any{generation, list, all}, err
}

// priorBackoff is the set-aside backoff the claim read on an event's row (0
// if it was not set aside).
func (c *Claim) priorBackoff(historyID string) time.Duration {
	if d, ok := c.backoffs[historyID]; ok {
		return d
	}
	for _, p := range c.Events {
		if p.HistoryID == historyID {
			return p.Backoff
		}
	}
	return 0
}
