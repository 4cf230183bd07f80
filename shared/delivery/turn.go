package delivery

import (
	"context"
	"sync"
	"time"

	"github.com/segmentstream/ontology-replication/shared/store"
)

// The drain function's side of the turns (see Drain and store.TakeTurn):
// what a drain does between taking its turn and its claim, and what this
// process knows of its workspaces' wake-ups.

// awaitTurn readies a turn for its claim. A drain next for the turn waits
// for it. A drain that holds the next turn (it waited for the turn, or took
// it free with the next) then gathers commits until Config.Gather has
// passed since it began to wait, on the wake-up's first claim only, so that
// one batch takes the commits of several wake-ups: the workspace is busy
// (Drain takes turns only then). Until the claim, wake-ups of this process
// are coalesced into it without a statement.
func (s *Service) awaitTurn(ctx context.Context, turn *store.Turn, local *localTurn, first bool, res *DrainResult) error {
	if !turn.HoldsNext() {
		return nil
	}
	local.enter()
	defer local.leave() // before the claim: a wake-up from now on is not counted on it
	started := time.Now()
	if turn.Role() == store.TurnNext {
		err := turn.Wait(ctx, s.cfg.TurnWait)
		res.Waited += time.Since(started)
		if err != nil {
			return err
		}
	}
	if gather := s.cfg.Gather - time.Since(started); gather > 0 && first {
		select {
		case <-ctx.Done():
			turn.End(ctx)
			return context.Cause(ctx)
		case <-time.After(gather):
		}
	}
	return nil
}

// turns are, per workspace, the drains of this process that wait for their
// workspace's turn (see Drain).
type turns struct{ m sync.Map }

func (t *turns) of(workspace string) *localTurn {
	v, ok := t.m.Load(workspace)
	if !ok {
		v, _ = t.m.LoadOrStore(workspace, &localTurn{next: make(chan struct{})})
	}
	return v.(*localTurn)
}

// localTurn counts the drains of this process waiting for one workspace's
// turn (one at a time, as the next turn is one lock, but the count does not
// rely on it). A wake-up that finds one waiting, or sees next closed while
// it waits for a connection, leaves its events to it: that drain claims
// after the wake-up looked, so after its commit.
type localTurn struct {
	mu      sync.Mutex
	waiting int
	// next is closed while a drain waits, and replaced when none does.
	next chan struct{}
	// last is when the last wake-up of the workspace reached this
	// process, and mean the mean time between them (exponentially
	// weighted; at most maxInterval).
	last       time.Time
	mean       time.Duration
	meanLoaded bool
}

// maxInterval bounds localTurn's mean interval, so that a burst after a
// quiet spell counts as busy within a dozen wake-ups.
const maxInterval = time.Second

// arrived records a wake-up of the workspace.
func (l *localTurn) arrived(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	dt := maxInterval
	if !l.last.IsZero() {
		dt = min(now.Sub(l.last), maxInterval)
	}
	l.last = now
	if !l.meanLoaded {
		l.mean, l.meanLoaded = dt, true
		return
	}
	l.mean = (4*l.mean + dt) / 5
}

// interval is the mean time between this process's wake-ups of the
// workspace.
func (l *localTurn) interval() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.meanLoaded {
		return maxInterval
	}
	return l.mean
}

// state reports whether a drain waits, and the channel the next one to
// wait closes.
func (l *localTurn) state() (bool, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting > 0, l.next
}

func (l *localTurn) enter() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waiting++; l.waiting == 1 {
		close(l.next)
	}
}

func (l *localTurn) leave() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waiting--; l.waiting == 0 {
		l.next = make(chan struct{})
	}
}
