package delivery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

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
			return fmt.Errorf("drain: %w", err)
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

// published is a batch whose publish has ended.
type published struct {
	claim *store.Claim
	out   *publishing
}

// session drains on one store session until nothing publishable is left,
// replication pauses, the drain is stopped, or a fault: the batches out
// are then published and finished, and the session closed.
func (d *bulkDrain) session() error {
	s, ws := d.svc, d.ws
	bctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), d.step)
	lease, err := s.lease(bctx, ws)
	if err != nil {
		cancel()
		return err
	}
	defer lease.Release()
	state, target, ss, err := lease.store.OpenSession(bctx)
	cancel()
	switch {
	case errors.Is(err, store.ErrNoActiveTarget):
		d.pause(StateNoActiveTarget)
		return nil
	case err != nil:
		return err
	case ss == nil && !state.Enabled:
		d.pause(StateDisabled)
		return nil
	case ss == nil:
		return errLegacy
	}
	defer ss.Close(context.WithoutCancel(d.ctx))
	d.setState(StateActive)

	done := make(chan published, d.drains)
	out := 0              // batches being published
	var ended []published // batches published, to finish
	exhausted := false    // the last claim reached the end of the queue: claim again, from its head, once none is out
	var fault error       // the first fault: nothing more is claimed
	paused := false
	for {
		if out == 0 && len(ended) == 0 && !d.mayClaim() {
			// Between While's turns: the session's connection goes back
			// to the pool, for the pages to take on a pool of one.
			ss.Idle(context.WithoutCancel(d.ctx))
			if !d.awaitTurn() {
				return fault
			}
		}
		mayClaim := func() bool {
			return fault == nil && !paused && !d.stopped() && d.mayClaim() && out < d.drains && !(exhausted && out > 0)
		}
		if len(ended) == 0 && !mayClaim() {
			if out == 0 {
				return fault
			}
			ended = append(ended, <-done)
			out--
		}
		for more := true; more; {
			select {
			case p := <-done:
				ended = append(ended, p)
				out--
			default:
				more = false
			}
		}
		finish := make([]store.Finishing, len(ended))
		for i, p := range ended {
			finish[i] = store.Finishing{Claim: p.claim, Accepted: p.out.acceptedIDs(), SetAside: p.out.aside}
			if p.out.err != nil && fault == nil {
				fault = p.out.err
			}
		}
		claim := mayClaim()
		wasProducing := d.producing.Load() // before the claim: pages done after it may have made more pending
		ctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), d.step)
		_, state, c, err := ss.Next(ctx, finish, claim)
		cancel()
		for _, p := range ended {
			if p.claim.Ended() {
				d.count(len(p.out.accepted), len(p.out.aside))
				s.logSetAside(d.ctx, ws, target, p.out.aside)
			} else {
				// Published but not acknowledged: the events stay pending
				// and are published again later. Duplicates, never a loss.
				p.claim.Release(context.WithoutCancel(d.ctx))
			}
		}
		ended = nil
		if err != nil {
			if fault == nil {
				fault = err
			}
			continue
		}
		if !claim {
			continue
		}
		switch {
		case !state.Enabled:
			d.pause(StateDisabled)
			paused = true
		case state.ActiveGeneration != target.Generation:
			d.pause(StateNoActiveTarget)
			paused = true
		case c == nil || (len(c.Events) == 0 && len(c.Unpublishable) == 0):
			if out > 0 {
				exhausted = true // nothing more after the batches out: finish them, then look from the head
				continue
			}
			exhausted = false
			d.endTurn() // nothing publishable is left, from the head of the queue
			if !wasProducing {
				return fault
			}
		default:
			exhausted = !c.More
			out++
			go func(c *store.Claim) {
				ctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), d.step)
				defer cancel()
				done <- published{claim: c, out: s.publishBatch(ctx, ws, c)}
			}(c)
		}
	}
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

// each drains a legacy database as concurrent wake-ups of the drain
// function do: Drains drains, each claiming, publishing and acknowledging
// one batch at a time on a connection of its own (the SDK's legacy scan
// locks nothing; see store.ClaimActive), until nothing publishable is
// left, in While's turns. Each batch is retried on its own.
func (d *bulkDrain) each() error {
	for {
		if !d.awaitTurn() {
			return nil
		}
		wasProducing := d.producing.Load()
		paused, err := d.eachRound()
		if err != nil {
			return err
		}
		d.endTurn()
		if paused || !wasProducing || d.stopped() {
			return nil
		}
	}
}

// eachRound runs the legacy drains until none finds anything to publish;
// it reports whether replication was paused.
func (d *bulkDrain) eachRound() (bool, error) {
	s := d.svc
	g, gctx := errgroup.WithContext(d.gctx)
	var paused atomic.Bool
	for range d.drains {
		g.Go(func() error {
			for {
				if d.ctx.Err() != nil || gctx.Err() != nil || paused.Load() {
					return nil
				}
				var r DrainResult
				rctx, stop := context.WithCancel(gctx)
				unhook := context.AfterFunc(d.ctx, stop)
				err := s.retrying(rctx, "drain", d.ws.ID, func() error {
					bctx, cancel := context.WithTimeout(gctx, d.step)
					defer cancel()
					var err error
					r, err = s.drainOnce(bctx, d.ws.ID)
					// Acknowledged before the failure: counted once, never
					// published again by the retry.
					d.count(r.Published, r.SetAside)
					if err != nil {
						r.Published, r.SetAside = 0, 0
					}
					return err
				})
				unhook()
				stop()
				if err != nil {
					if d.ctx.Err() != nil && Transient(err) {
						return nil // interrupted while waiting to retry
					}
					return fmt.Errorf("drain: %w", err)
				}
				if r.State != StateActive {
					paused.Store(true)
					d.pause(r.State)
					return nil
				}
				d.setState(r.State)
				if (r.Published > 0 || r.SetAside > 0) && r.More {
					continue
				}
				return nil // nothing publishable left for this drain
			}
		})
	}
	err := g.Wait()
	return paused.Load(), err
}

func cmpDuration(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
