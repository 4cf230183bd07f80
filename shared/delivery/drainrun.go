package delivery

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/segmentstream/ontology-replication/shared/store"
)

// drainRun is one run of a drainer, from the wake-up that started it to
// nextStep's stepStop: the loop that performs the rules' steps, and what
// it knows. Only the run's goroutine touches it.
type drainRun struct {
	d   *drainer
	s   *Service
	ctx context.Context // ends when the shutdown's grace has run out
	end context.CancelFunc

	lease   *workspaceLease
	ss      *store.Session // its claims' session (protocol 4)
	legacy  bool           // protocol 3: claims of their own (ClaimActive), one at a time
	run     uint64         // its number among the drainer's runs (WakeAnswer.Run)
	covered uint64         // the wakes its last claim began after
	done    chan published // batches whose publish ended
	out     int
	ended   []published
	aside   *published // a lone event's failed batch, kept out until the claim beside it (see suspects)

	more, held, probe bool
	fault             error
	retryAt           time.Time
	backoff           time.Duration // the next fault's
	heldBackoff       time.Duration // the next held events' look
	gatherUntil       time.Time
	claimedAt         time.Time // its last claim's end
	stopping          bool      // Shutdown began: seen once
	abandoned         bool      // its grace ran out

	tally runTally
}

// published is a claimed batch whose publish has ended.
type published struct {
	claim *store.Claim
	ss    *store.Session // its session (nil: a claim of its own)
	out   *publishing
}

// A drainer's backoffs, doubling: after a fault (to maxStuckBackoff when
// it needs a person), and between looks at events other claims hold.
const (
	firstBackoff    = 100 * time.Millisecond
	maxFaultBackoff = 5 * time.Second
	maxStuckBackoff = time.Minute
	maxHeldBackoff  = 2 * time.Second
)

// roundTimeout ends a round trip whose server stopped answering (longer
// than the turn's wait and the statement timeouts).
const roundTimeout = time.Minute

// run is the drainer's goroutine: one run, until its rules stop it.
func (d *drainer) run(ctx context.Context) {
	ds := d.svc.drainers
	defer ds.wg.Done()
	defer ds.ended()
	ctx, end := context.WithCancel(ctx)
	d.mu.Lock()
	run := d.runs // no other run starts before this one ends
	d.mu.Unlock()
	r := &drainRun{d: d, s: d.svc, ctx: ctx, end: end, run: run, done: make(chan published, d.svc.cfg.BatchesOut+1),
		backoff: firstBackoff, heldBackoff: firstBackoff, tally: runTally{since: time.Now()}}
	// The grace running out ends the step the run is in (a claim, a wait
	// for the turn), not only its waits: a stopping drainer still claims.
	go func() {
		select {
		case <-ds.abandon:
			end()
		case <-ctx.Done():
		}
	}()
	defer r.close()
	r.loop()
}

// loop performs the rules' steps until they stop the run.
func (r *drainRun) loop() {
	for {
		step := nextStep(r.state())
		switch step.Kind {
		case stepStop:
			if r.d.stop(r.covered) {
				return
			}
		case stepQueue:
			r.queue()
		case stepClaim:
			r.claim()
		case stepFinish:
			r.finish()
		case stepLeaveTurn:
			r.ss.LeaveTurn(r.ctx)
		case stepWait:
			r.wait(step.Until)
		}
		r.tally.logEvery(r)
	}
}

// state is what the rules decide on.
func (r *drainRun) state() drainState {
	wakes, busy := r.d.snapshot(r.s.cfg.QuietInterval)
	st := drainState{Now: time.Now(), Stopping: r.stopping, Abandoned: r.abandoned, Wanted: wakes != r.covered, Busy: busy, Legacy: r.legacy,
		Out: r.out, Ended: len(r.ended), MaxOut: r.s.cfg.BatchesOut, More: r.more, Held: r.held, Probe: r.probe,
		Fault: r.fault != nil, RetryAt: r.retryAt, GatherUntil: r.gatherUntil, AckBy: r.claimedAt.Add(r.s.cfg.Gather)}
	if r.ss != nil {
		st.HoldsNext = r.ss.HoldsNext()
	}
	if r.abandoned {
		st.Out, st.Ended = 0, 0
	}
	return st
}

// leased returns the workspace's store, leasing its pool for the rest of
// the run on first use, and makes the run's session if it has none.
func (r *drainRun) leased() (*store.Store, error) {
	if r.lease == nil {
		ctx, cancel := context.WithTimeout(r.ctx, roundTimeout)
		defer cancel()
		lease, err := r.s.lease(ctx, r.d.ws)
		if err != nil {
			return nil, err
		}
		r.lease = lease
		r.legacy = lease.store.Legacy()
	}
	if !r.legacy && r.ss == nil {
		r.ss = r.lease.store.NewSession()
	}
	return r.lease.store, nil
}

// queue takes the workspace's next turn, waiting in the server for the
// drainers of other processes ahead, and sets the gathering: a claim owed
// to wake-ups waits Config.Gather for more of them; one for a backlog
// (More) does not.
func (r *drainRun) queue() {
	if _, err := r.leased(); err != nil {
		r.failed(err)
		return
	}
	ss := r.ss
	ctx, cancel := context.WithTimeout(r.ctx, roundTimeout)
	defer cancel()
	waited, err := ss.QueueTurn(ctx, r.s.cfg.TurnWait)
	if err != nil {
		r.failed(err)
		return
	}
	r.tally.waited += waited
	r.gatherUntil = time.Now()
	if !r.more && r.s.cfg.Gather > 0 {
		r.gatherUntil = r.gatherUntil.Add(r.s.cfg.Gather)
	}
}

// claim finishes the ended batches and claims the next batch, whose
// publish it starts: on the run's session or, at protocol 3, on a claim of
// its own (which holds the turn until it ends).
func (r *drainRun) claim() {
	st, err := r.leased()
	if err != nil {
		r.failed(err)
		return
	}
	ss, finish := r.ss, r.ended
	r.ended = nil
	ctx, cancel := context.WithTimeout(r.ctx, roundTimeout)
	ownErr := finishOwn(ctx, finish)
	r.covered, _ = r.d.snapshot(r.s.cfg.QuietInterval) // before the claim: it sees every commit these wake-ups followed
	r.fault, r.probe = nil, false
	var state store.State
	var c *store.Claim
	if r.legacy {
		state, _, c, err = st.ClaimActive(ctx)
		r.legacy = st.Legacy()
	} else {
		_, state, c, err = ss.Next(ctx, r.finishing(finish), true)
	}
	cancel()
	r.tally.claims++
	r.finished(finish)
	if ownErr != nil {
		r.failed(ownErr)
	}
	r.placeAside()
	switch {
	case errors.Is(err, store.ErrLegacyDatabase):
		r.closeSession()
		r.legacy, r.more = true, true // claim again, on a claim of its own
	case errors.Is(err, store.ErrNoActiveTarget):
		r.settled(StateNoActiveTarget, "")
	case err != nil:
		r.failed(err)
	case c == nil && (!state.Enabled || ss == nil):
		r.settled(StateDisabled, state.ActiveGeneration)
	case c == nil:
		// Another generation became active as it claimed: a new session
		// drains that one.
		r.closeSession()
		r.more = true
	default:
		r.claimed(c, ss)
	}
}

// settled records that replication is not active (disabled, no active
// target): nothing is owed until the next wake-up.
func (r *drainRun) settled(state, generation string) {
	r.tally.state, r.tally.generation = state, generation
	r.more, r.held = false, false
	r.d.setFailing(nil)
	r.backoff = firstBackoff
}

// claimed takes a claim's result: what it took goes to Pub/Sub, and what
// it found tells whether more claims are owed.
func (r *drainRun) claimed(c *store.Claim, ss *store.Session) {
	r.tally.state, r.tally.generation = StateActive, c.Target().Generation
	took := len(c.Events) > 0 || len(c.Unpublishable) > 0
	r.more = c.More && took
	r.held = c.Held > 0
	if r.held {
		r.s.log.DebugContext(r.ctx, LogDrainHeld, slog.String("workspace", r.d.ws.ID), slog.Int("held", c.Held),
			slog.Int64("backoff_ms", r.heldBackoff.Milliseconds()))
		r.retryAt = time.Now().Add(r.heldBackoff)
		r.heldBackoff = min(2*r.heldBackoff, maxHeldBackoff)
	} else {
		r.heldBackoff = firstBackoff
	}
	if !took {
		c.Release(r.ctx)
		if !r.held && r.fault == nil && r.aside == nil && r.out == 0 {
			r.d.setFailing(nil) // nothing pending: nothing is failing
			r.backoff = firstBackoff
		}
		return
	}
	r.out++
	r.claimedAt = time.Now()
	go func() {
		r.done <- published{claim: c, ss: ss, out: r.s.publishBatch(r.ctx, r.d.ws, c)}
	}()
}

// failed records a fault: the drainer answers wake-ups 503 and claims
// again after a backoff. The fault is logged, with its cause.
func (r *drainRun) failed(err error) {
	select {
	case <-r.s.drainers.abandon:
		// The grace ran out in the middle of the step (its context ended
		// with it): not a fault; what is out is given up.
		r.abandon()
		return
	default:
	}
	r.fault = err
	r.tally.faults++
	backoff := r.backoff
	r.retryAt = time.Now().Add(backoff)
	limit, level := maxFaultBackoff, slog.LevelWarn
	if !Transient(err) {
		limit, level = maxStuckBackoff, slog.LevelError
	}
	r.backoff = min(2*backoff, limit)
	if r.ss != nil && (r.ss.Dirty() || r.out == 0) {
		r.closeSession()
	}
	r.s.log.Log(r.ctx, level, LogDrainFault, slog.String("workspace", r.d.ws.ID), slog.String("cause", Cause(err)),
		slog.Int64("backoff_ms", backoff.Milliseconds()), slog.String("error", err.Error()))
	r.d.setFailing(err) // after its line: a wake-up answered for the fault finds it logged
}

// closeSession ends the run's session: its claims out are released (their
// events pending again); their publishes still end, and are dropped.
func (r *drainRun) closeSession() {
	if r.ss != nil {
		r.ss.Close(r.ctx)
		r.ss = nil
	}
}

// wait waits until until (or the session's next touch), a batch's publish
// ends, a wake-up comes, or the process begins to stop.
func (r *drainRun) wait(until time.Time) {
	if r.ss != nil {
		if at := r.ss.TouchAt(); !at.IsZero() && (until.IsZero() || at.Before(until)) {
			until = at
		}
	}
	var timer <-chan time.Time
	if !until.IsZero() {
		t := time.NewTimer(time.Until(until))
		defer t.Stop()
		timer = t.C
	}
	ds := r.s.drainers
	stop, abandon := ds.stop, ds.abandon
	if r.stopping {
		stop = nil
	}
	select {
	case p := <-r.done:
		r.publishEnded(p)
	case <-r.d.kick:
	case <-timer:
	case <-stop:
		r.stopping = true
	case <-abandon:
		r.abandon()
		return
	}
	if r.ss != nil {
		if err := r.ss.Touch(r.ctx); err != nil {
			r.failed(err)
		}
	}
}

// abandon gives up what is out when the shutdown's grace has run out: the
// publishes are cancelled (they end at once) and every claim released,
// nothing acknowledged.
func (r *drainRun) abandon() {
	r.abandoned, r.stopping = true, true
	r.end()
	if r.aside != nil {
		r.ended = append(r.ended, *r.aside)
		r.aside = nil
	}
	timeout := time.After(abandonWait)
	for waiting := r.out; waiting > 0; waiting-- {
		select {
		case p := <-r.done:
			r.ended = append(r.ended, p)
		case <-timeout:
			waiting = 0 // its claim ends with the session, or with its pool
		}
	}
	r.out = 0
	r.tally.released = len(r.ended)
	r.closeSession()
	for _, p := range r.ended {
		r.tally.unacknowledged += len(p.out.accepted)
		if p.ss == nil {
			p.claim.Release(context.WithoutCancel(r.ctx))
		}
	}
	r.ended = nil
}

// abandonWait bounds an abandoning drainer's wait for a cancelled
// publish's end.
const abandonWait = 2 * time.Second

// close ends the run: the session and the lease go back, and the run's
// line is written (with what it left, if the process stopped).
func (r *drainRun) close() {
	r.end()
	r.closeSession()
	if r.lease != nil {
		r.lease.Release()
	}
	wakes, _ := r.d.snapshot(r.s.cfg.QuietInterval)
	r.tally.log(r, wakes != r.covered)
}
