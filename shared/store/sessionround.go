package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// One round trip of a Session (Next): the finish of the ended claims and
// the next claim, queued as one pipeline and read back in order.

// round is one round trip of Next: the claims it finishes and whether it
// claims, and what it read back.
type round struct {
	finish          []Finishing
	claim           bool
	accepted, aside []string
	backoffs        []int64
	keys            []int32 // the finished claims' locks, and the session's spare ones
	spare           int     // how many of keys are the session's spare
	// final: the finished claims are the session's last out and nothing
	// follows: Finish's shape, which lets every lock go (see Next).
	final bool
	// hold is what of the turns the claim's session holds (QueueTurn).
	hold turnHold

	receipts  int64
	state     State
	target    Target // the active target, as the claim read it
	targetErr error  // why there is none (ErrNoActiveTarget)
	cands     []candidate
	limit     int           // the candidates' page limit (pageLimit)
	waited    time.Duration // the claim's wait for the turn
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
	r.keys, r.spare = append(r.keys, ss.spare...), len(ss.spare)
	r.final = !claim && len(finish) > 0 && len(finish) == ss.out && !ss.nextHeld && !ss.turnHeld && !ss.dirty
	if claim && ss.nextHeld {
		r.hold = turnHold{next: true, turn: ss.turnHeld, take: !ss.turnHeld, bound: ss.turnBound}
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
		if r.final {
			queueShareLifecycle(b, s.cfg)
			b.Queue(query, args...)
		} else {
			queueAcknowledgement(b, s.cfg, query, args)
		}
	}
	switch {
	case r.final:
		queueUnlock(b, ss.idlePrior)
	case len(r.keys) > 0:
		b.Queue(sqlUnlockKeys, ClaimLockClass, r.keys)
	}
	if r.claim {
		read, err := s.readTables(ctx, ss.conn)
		if err != nil {
			return nil, fmt.Errorf("store: claim pending events of %s: %w", t.Generation, err)
		}
		switch {
		case r.hold.take:
			b.Queue(sqlClaimSessionTakingTurn, ms(s.cfg.StatementTimeout), ms(s.cfg.LockTimeout), LifecycleLock, DrainTurnClass, ms(r.hold.bound))
		case r.hold.next:
			b.Queue(sqlClaimSessionLeavingNext, ms(s.cfg.StatementTimeout), ms(s.cfg.LockTimeout), LifecycleLock, DrainTurnClass)
		default:
			b.Queue(sqlClaimSession, ms(s.cfg.StatementTimeout), ms(s.cfg.LockTimeout), LifecycleLock)
		}
		b.Queue(sqlClaimState)
		var generation any // the active one, on the session's first claim
		if t.Generation != "" {
			generation = t.Generation
		}
		finishing := make([]*Claim, len(r.finish))
		for i, f := range r.finish {
			finishing[i] = f.Claim
		}
		r.limit = s.queueCandidates(b, generation, read, nil, ss.ownKeys(finishing...), s.cfg.IdleTimeout)
		if r.hold.next {
			b.Queue(sqlReleaseTurn, DrainTurnClass)
		}
	}
	return b, nil
}

// sqlUnlockKeys releases a session's claim locks of the given keys ($2,
// each taken once), after the COMMIT that acknowledged their events; it
// returns how many it released.
const sqlUnlockKeys = `SELECT count(*) FROM unnest($2::int4[]) AS k WHERE pg_advisory_unlock(hashtext($1), k)`

// queueUnlock queues the release of every lock of the session, with its
// idle_session_timeout put back (to prior when known).
func queueUnlock(b *pgx.Batch, prior *string) {
	if prior != nil {
		b.Queue(sqlUnlockRestore, *prior)
		return
	}
	b.Queue(sqlUnlockAll)
	b.Queue(sqlResetIdle)
}

// sendRound sends the round and reads what it returns; a failure after
// the claim's statement began leaves the session dirty (it may hold locks
// no claim knows).
func (ss *Session) sendRound(ctx context.Context, b *pgx.Batch, r *round) error {
	results := ss.conn.SendBatch(ctx, b)
	stage, claiming := "acknowledge", false
	err := ss.readRound(results, r, &stage, &claiming)
	if cerr := results.Close(); err == nil && cerr != nil {
		err = cerr
	}
	ss.used = time.Now()
	if r.hold.next {
		// Let go by the claim's statements, or to be let go now.
		if err != nil {
			ss.LeaveTurn(ctx)
		}
		ss.nextHeld, ss.turnHeld = false, false
	}
	if err == nil {
		return nil
	}
	if claiming {
		ss.dirty = true
	}
	if ss.conn != nil && ss.conn.Conn().PgConn().TxStatus() != 'I' {
		_, _ = ss.conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
	}
	if r.hold.take && stage == "claim pending events of" {
		err = ss.turnWaitOrLock(ctx, err)
	}
	return fmt.Errorf("store: %s %s: %w", stage, ss.target.Generation, err)
}

// readRound reads the round's results in the order they were queued.
func (ss *Session) readRound(results pgx.BatchResults, r *round, stage *string, claiming *bool) error {
	if r.ack() {
		receipts, err := readFinish(results, r.final)
		if err != nil {
			return err
		}
		if len(r.accepted) > 0 {
			r.receipts = receipts
		}
	}
	if r.final {
		if err := readUnlock(results, ss.idlePrior); err != nil {
			// Acknowledged or not, its locks may be held: the connection is
			// closed by Close rather than reused.
			ss.dirty = true
			return err
		}
		ss.armed, ss.spare = false, ss.spare[r.spare:]
	}
	// Committed (or nothing to commit): the claims are finished.
	for _, f := range r.finish {
		f.Claim.locked, f.Claim.out = false, false
		ss.out--
	}
	if !r.final && len(r.keys) > 0 {
		*stage = "release the claims of"
		var released int
		if err := results.QueryRow().Scan(&released); err != nil {
			ss.dirty = true
			return err
		}
		if released != len(r.keys) {
			ss.dirty = true // locks a claim took twice, or lost: Close releases every one
		}
		ss.spare = ss.spare[r.spare:]
	}
	if !r.claim {
		return nil
	}
	*stage = "claim pending events of"
	prior, waited, err := readClaimSession(results, r.hold)
	if err != nil {
		return err
	}
	r.waited = waited
	if ss.idlePrior == nil {
		ss.idlePrior = &prior
	}
	var state State
	state, r.target, r.targetErr = readClaimState(results.QueryRow())
	if r.targetErr != nil && !errors.Is(r.targetErr, ErrNoActiveTarget) {
		return r.targetErr
	}
	r.state = state
	// The statement's try-locks are the session's from here on: when it
	// fails, the session may hold some that no claim knows, and its
	// idle_session_timeout may be set.
	*claiming, ss.armed = true, true
	rows, err := results.Query()
	if err != nil {
		return err
	}
	if r.cands, err = collectCandidates(rows, ss.store.backoffs); err != nil {
		return err
	}
	if r.hold.next {
		if _, err := results.Exec(); err != nil {
			return err
		}
	}
	return nil
}

// readFinish reads an acknowledgement: the transaction's, or with final
// Finish's implicit one (the lifecycle lock and the finish statement). It
// returns the rows the finish statement wrote.
func readFinish(results pgx.BatchResults, final bool) (int64, error) {
	if !final {
		return readAcknowledgement(results)
	}
	if _, err := results.Exec(); err != nil {
		return 0, err
	}
	tag, err := results.Exec()
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// readUnlock reads what queueUnlock queued.
func readUnlock(results pgx.BatchResults, prior *string) error {
	if _, err := results.Exec(); err != nil {
		return err
	}
	if prior == nil {
		_, err := results.Exec()
		return err
	}
	return nil
}
