package delivery

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/store"
)

// bulkDrain is one DrainAll.
type bulkDrain struct {
	svc     *Service
	ws      registry.Workspace
	ctx     context.Context // the caller's: its end stops the claims
	gctx    context.Context // ends when While or the drain failed
	drains  int
	step    time.Duration
	tracker Tracker

	// producing: While runs; produced is closed when it has returned.
	producing atomic.Bool
	produced  chan struct{}
	// turns carries While's requests for a turn of the drain; the drain
	// answers on the request's channel once nothing publishable is left.
	// current is the turn the drain is taking (nil between turns); only
	// the drain's goroutine touches it.
	turns   chan chan error
	current chan error

	mu  sync.Mutex
	res DrainAllResult
}

func (d *bulkDrain) result() DrainAllResult {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.res
}

// count adds what a batch's finish acknowledged and set aside.
func (d *bulkDrain) count(published, setAside int) {
	if published == 0 && setAside == 0 {
		return
	}
	d.mu.Lock()
	d.res.Published += published
	d.res.SetAside += setAside
	d.mu.Unlock()
	d.tracker.Add(published)
}

// stopped reports that no more should be claimed: the command was
// interrupted, or While or the drain failed.
func (d *bulkDrain) stopped() bool { return d.ctx.Err() != nil || d.gctx.Err() != nil }

// turn is the drain function While calls: the drain publishes what is
// pending now, and turn returns once nothing publishable is left.
func (d *bulkDrain) turn(ctx context.Context) error {
	done := make(chan error, 1)
	select {
	case d.turns <- done:
	case <-ctx.Done():
		return ctx.Err()
	case <-d.gctx.Done():
		return errDrainEnded
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-d.gctx.Done():
		return errDrainEnded
	}
}

// errDrainEnded is what While's drain returns when the drain has failed:
// DrainAll returns the drain's own error.
var errDrainEnded = errors.New("the drain ended")

// mayClaim reports whether the drain may claim now: While has returned,
// or asked for a turn.
func (d *bulkDrain) mayClaim() bool { return d.current != nil || !d.producing.Load() }

// awaitTurn waits until the drain may claim; false when it must stop
// instead.
func (d *bulkDrain) awaitTurn() bool {
	if d.mayClaim() {
		return true
	}
	select {
	case d.current = <-d.turns:
		return true
	case <-d.produced:
		return true
	case <-d.gctx.Done():
	case <-d.ctx.Done():
	}
	return false
}

// endTurn answers While: nothing publishable is left now.
func (d *bulkDrain) endTurn() {
	if d.current != nil {
		d.current <- nil
		d.current = nil
	}
}

// run drains in sessions until nothing publishable is left: a transient
// fault ends a session, and the next one starts after a pause (the
// service's RetryPolicy, whose budget starts again once a session has
// acknowledged something).
func (d *bulkDrain) run() error {
	s := d.svc
	// Retries end with the command, or when While failed.
	rctx, stop := context.WithCancel(d.gctx)
	defer stop()
	defer context.AfterFunc(d.ctx, stop)()
	for {
		var again error
		err := s.retrying(rctx, "drain", d.ws.ID, func() error {
			before := d.result()
			err := d.session()
			if errors.Is(err, errFailedAlone) {
				// An event failed alone at the head of the queue: a wake-up's
				// drain takes it again and drains the next batch beside it
				// (probe), so that it is set aside or goes, and the events
				// behind it flow.
				once, onceErr := s.drainOnce(d.ctx, d.ws.ID)
				d.count(once.Published, once.SetAside)
				err = cmp.Or(onceErr, err)
			}
			after := d.result()
			if err != nil && Transient(err) && (after.Published > before.Published || after.SetAside > before.SetAside) {
				again = err // progress before the fault: a new session with a new budget
				return nil
			}
			return err
		})
		if errors.Is(err, errLegacy) {
			return d.each()
		}
		if err != nil {
			if d.ctx.Err() != nil && Transient(err) {
				return nil // interrupted while waiting to retry
			}
			return err // retrying named the operation when it retried; the store names its step
		}
		if again == nil || d.stopped() {
			return nil
		}
		s.log.WarnContext(d.ctx, "replication: a transient fault ended a drain session; starting another",
			slog.String("operation", "drain"), slog.String("workspace", d.ws.ID), slog.String("cause", again.Error()))
	}
}

// errLegacy: the database is at protocol 3, which has no delivery queue to
// hold a session on (see bulkDrain.each).
var errLegacy = errors.New("a legacy database")

// session drains on one store session until nothing publishable is left,
// replication pauses, the drain is stopped, or a fault: the batches out
// are then published and finished, and the session closed.
func (d *bulkDrain) session() error {
	lease, ss, target, err := d.openSession()
	if ss == nil {
		return err
	}
	defer lease.Release()
	defer ss.Close(context.WithoutCancel(d.ctx))
	d.setState(StateActive)
	run := &sessionRun{d: d, ss: ss, target: target, done: make(chan published, d.drains)}
	return run.loop()
}

// openSession leases the workspace's pool and opens a drain session on the
// active target. Without a session (nil) it has released the lease and
// says why: replication paused or without an active target (nil, the
// drain's state recorded), a legacy database (errLegacy), a fault.
func (d *bulkDrain) openSession() (*workspaceLease, *store.Session, store.Target, error) {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), d.step)
	defer cancel()
	lease, err := d.svc.lease(bctx, d.ws)
	if err != nil {
		return nil, nil, store.Target{}, err
	}
	state, target, ss, err := lease.store.OpenSession(bctx)
	if ss != nil && err == nil {
		return lease, ss, target, nil
	}
	lease.Release()
	switch {
	case errors.Is(err, store.ErrNoActiveTarget):
		d.pause(StateNoActiveTarget)
		return nil, nil, target, nil
	case err != nil:
		return nil, nil, target, err
	case !state.Enabled:
		d.pause(StateDisabled)
		return nil, nil, target, nil
	}
	return nil, nil, target, errLegacy
}

// sessionRun is one drain session's loop: its batches out, those ended and
// to finish, and why it stops claiming.
type sessionRun struct {
	d      *bulkDrain
	ss     *store.Session
	target store.Target
	done   chan published // batches whose publish ended

	out       int         // batches being published
	ended     []published // batches published, to finish
	exhausted bool        // the last claim reached the end of the queue: claim again, from its head, once none is out
	fault     error       // the first fault: nothing more is claimed
	paused    bool
}

// loop finishes the ended batches and claims the next, one round trip at a
// time, until nothing is left to claim and nothing is out.
func (r *sessionRun) loop() error {
	d := r.d
	for {
		if r.out == 0 && len(r.ended) == 0 && !d.mayClaim() {
			// Between While's turns: the session's connection goes back
			// to the pool, for the pages to take on a pool of one.
			r.ss.Idle(context.WithoutCancel(d.ctx))
			if !d.awaitTurn() {
				return r.fault
			}
		}
		if len(r.ended) == 0 && !r.mayClaim() {
			if r.out == 0 {
				return r.fault
			}
			r.awaitEnded()
			continue
		}
		r.collectEnded()
		finish := r.finishing() // first: a batch that failed stops the claims
		claim := r.mayClaim()
		wasProducing := d.producing.Load() // before the claim: pages done after it may have made more pending
		state, c, err := r.next(finish, claim)
		if err != nil || !claim {
			continue
		}
		if r.take(state, c, wasProducing) {
			return r.fault
		}
	}
}

// mayClaim reports whether the session may claim another batch now.
func (r *sessionRun) mayClaim() bool {
	d := r.d
	return r.fault == nil && !r.paused && !d.stopped() && d.mayClaim() && r.out < d.drains && !(r.exhausted && r.out > 0)
}

// awaitEnded waits for a batch's publish to end, touching the session
// meanwhile when it is due (store.Session.Touch), so that a long publish
// never lets the server's idle timeout end it.
func (r *sessionRun) awaitEnded() {
	for {
		var timer <-chan time.Time
		if at := r.ss.TouchAt(); !at.IsZero() {
			t := time.NewTimer(time.Until(at))
			defer t.Stop()
			timer = t.C
		}
		select {
		case p := <-r.done:
			r.ended = append(r.ended, p)
			r.out--
			return
		case <-timer:
			if err := r.ss.Touch(context.WithoutCancel(r.d.ctx)); err != nil && r.fault == nil {
				r.fault = err
			}
		}
	}
}

// collectEnded takes every batch whose publish has ended.
func (r *sessionRun) collectEnded() {
	for {
		select {
		case p := <-r.done:
			r.ended = append(r.ended, p)
			r.out--
		default:
			return
		}
	}
}

// finishing is what the ended batches finish with (what Pub/Sub accepted,
// what is set aside); the first publish that failed becomes the fault.
func (r *sessionRun) finishing() []store.Finishing {
	finish := make([]store.Finishing, len(r.ended))
	for i, p := range r.ended {
		finish[i] = store.Finishing{Claim: p.claim, Accepted: p.out.acceptedIDs(), SetAside: p.out.aside}
		if p.out.err != nil && r.fault == nil {
			r.fault = p.out.err
		}
	}
	return finish
}

// next is one round trip: it finishes the ended batches (the rest of
// their events left pending) and, with claim, claims the next batch. A
// fault stops the claims.
func (r *sessionRun) next(finish []store.Finishing, claim bool) (store.State, *store.Claim, error) {
	d := r.d
	ctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), d.step)
	_, state, c, err := r.ss.Next(ctx, finish, claim)
	cancel()
	for _, p := range r.ended {
		if p.claim.Ended() {
			d.count(len(p.out.accepted), len(p.out.aside))
			d.svc.asideWritten(d.ctx, d.ws, r.target, p.out.aside)
		} else {
			// Published but not acknowledged: the events stay pending
			// and are published again later. Duplicates, never a loss.
			p.claim.Release(context.WithoutCancel(d.ctx))
		}
	}
	r.ended = nil
	if err != nil && r.fault == nil {
		r.fault = err
	}
	return state, c, err
}

// take starts the publish of a claimed batch, or records why there is
// none; it reports whether the session is done (nothing publishable left
// and no pages producing more).
func (r *sessionRun) take(state store.State, c *store.Claim, wasProducing bool) bool {
	d := r.d
	switch {
	case !state.Enabled:
		d.pause(StateDisabled)
		r.paused = true
	case state.ActiveGeneration != r.target.Generation:
		d.pause(StateNoActiveTarget)
		r.paused = true
	case c == nil || (len(c.Events) == 0 && len(c.Unpublishable) == 0):
		if r.out > 0 {
			r.exhausted = true // nothing more after the batches out: finish them, then look from the head
			return false
		}
		r.exhausted = false
		d.endTurn() // nothing publishable is left, from the head of the queue
		return !wasProducing
	default:
		r.exhausted = !c.More
		r.out++
		go func(c *store.Claim) {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), d.step)
			defer cancel()
			r.done <- published{claim: c, out: d.svc.publishBatch(ctx, d.ws, c)}
		}(c)
	}
	return false
}

// pause records that replication is not active: the drain stops.
func (d *bulkDrain) pause(state string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.res.Paused, d.res.State = true, state
}

func (d *bulkDrain) setState(state string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.res.State = state
}
