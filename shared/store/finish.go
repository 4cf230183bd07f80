package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
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
func (c *Claim) Finish(ctx context.Context, accepted []string, setAside []SetAside) (int64, error) {
	if c.conn == nil {
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
	// One statement updates every row of the batch, so that its locks are
	// taken in one key order (see sqlFinish).
	var query string
	var args []any
	switch {
	case len(setAside) == 0:
		list, err := uuids(accepted)
		if err != nil {
			return fail(err)
		}
		query, args = sqlAcknowledge, []any{t.Generation, list}
	case len(accepted) == 0:
		ids, backoffs, err := c.backoffsFor(setAside)
		if err != nil {
			return fail(err)
		}
		query, args = sqlSetAside, []any{t.Generation, ids, backoffs}
	default:
		ids, backoffs, err := c.finishList(accepted, setAside)
		if err != nil {
			return fail(err)
		}
		query, args = sqlFinish, []any{t.Generation, ids, backoffs}
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(sqlBeginShared, ms(s.cfg.StatementTimeout), ms(s.cfg.LockTimeout), LifecycleLock)
	b.Queue(query, args...)
	b.Queue("COMMIT")
	b.Queue(sqlUnlockClaims)
	results := c.conn.SendBatch(ctx, b)
	var acked int64
	err := func() error {
		for i := range 5 {
			tag, err := results.Exec()
			if err != nil {
				return err
			}
			if i == 2 && len(accepted) > 0 {
				acked = tag.RowsAffected() // the receipts written
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

// backoffsFor returns the set-aside events' ids and their next backoffs:
// the first is Config.SetAsideBackoff, each later one twice the last, up to
// Config.SetAsideMaxBackoff. Every reason backs off the same way: the prior
// backoff is the one the claim read on the event's row, whether the store
// found the event unpublishable or Pub/Sub refused it.
func (c *Claim) backoffsFor(setAside []SetAside) ([]pgtype.UUID, []int64, error) {
	ids := make([]string, len(setAside))
	backoffs := make([]int64, len(setAside))
	for i, a := range setAside {
		ids[i] = a.HistoryID
		backoffs[i] = c.store.nextBackoff(c.priorBackoff(a.HistoryID)).Microseconds()
	}
	list, err := uuids(ids)
	return list, backoffs, err
}

// finishList returns sqlFinish's lists: the accepted events with no
// backoff, then the set-aside events with their next backoffs.
func (c *Claim) finishList(accepted []string, setAside []SetAside) ([]pgtype.UUID, []*int64, error) {
	ids := make([]string, 0, len(accepted)+len(setAside))
	backoffs := make([]*int64, 0, cap(ids))
	for _, id := range accepted {
		ids = append(ids, id)
		backoffs = append(backoffs, nil)
	}
	for _, a := range setAside {
		us := c.store.nextBackoff(c.priorBackoff(a.HistoryID)).Microseconds()
		ids = append(ids, a.HistoryID)
		backoffs = append(backoffs, &us)
	}
	list, err := uuids(ids)
	return list, backoffs, err
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
