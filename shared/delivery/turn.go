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

// takeTurn takes a drain's turn: its first as the process's pending drain,
// which waits for the drains ahead of it (store.QueueTurn) and returns
// holding the turn; a later one, when it goes on after a batch, takes the
// turn or the next turn if free, and otherwise leaves what is left to the
// drain that is next (store.TakeTurn).
func (s *Service) takeTurn(ctx context.Context, st *store.Store, first bool, res *DrainResult) (*store.Turn, error) {
	if !first {
		return st.TakeTurn(ctx)
	}
	started := time.Now()
	turn, err := st.QueueTurn(ctx, s.cfg.TurnWait)
	if err == nil && turn.Queued() {
		res.Waited += time.Since(started)
	}
	return turn, err
}

// awaitTurn readies a turn for its claim. A drain next for the turn (a
// later turn's, TakeTurn's) waits for it. A drain that holds the next
// turn then gathers commits until Config.Gather has passed since it held
// the next turn (QueueTurn's: since it began to wait for the turn), on the
// wake-up's first claim only, so that one batch takes the commits of
// several wake-ups: the workspace is busy (Drain takes turns only then).
// Until the claim, wake-ups of this process are coalesced into it without
// a statement: the first claim's drain is the process's pending drain
// already (Drain), a later one holding the next turn becomes it here. It
// stops being pending before it returns, and so before its claim: a
// wake-up from then on is not counted on it.
func (s *Service) awaitTurn(ctx context.Context, turn *store.Turn, local *localTurn, pending *pendingDrain, first bool, res *DrainResult) error {
	if !first && turn.HoldsNext() {
		pending = local.enter() // Drain's pending place was left at its first claim
	}
	defer pending.leave()
	if !turn.HoldsNext() {
		return nil
	}
	started := time.Now().Add(-turn.Waited())
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

// turns are, per workspace, what this process knows of its wake-ups and
// of its pending drain (see Drain).
type turns struct{ m sync.Map }

func (t *turns) of(workspace string) *localTurn {
	v, ok := t.m.Load(workspace)
	if !ok {
		v, _ = t.m.LoadOrStore(workspace, &localTurn{})
	}
	return v.(*localTurn)
}

// localTurn is this process's view of one workspace's turns: its pending
// drain, the one drain of the process that waits for a turn and has not
// claimed yet (a wake-up that finds it leaves its events to it: that drain
// claims after the wake-up looked, so after its commit), and how often
// the workspace's wake-ups come.
type localTurn struct {
	mu      sync.Mutex
	pending *pendingDrain
	// last is when the last wake-up of the workspace reached this
	// process, and mean the mean time between them (exponentially
	// weighted; at most maxInterval).
	last       time.Time
	mean       time.Duration
	meanLoaded bool
}

// pendingDrain is a drain's hold on its process's pending place: it holds
// it from enter until leave.
type pendingDrain struct{ l *localTurn }

// maxInterval bounds localTurn's mean interval, so that a burst after a
// quiet spell counts as busy within half a dozen wake-ups, and a pause of
// maxInterval makes the workspace quiet again at once.
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
	// Each interval weighs a third: a burst of a wake-up every 10 ms after
	// a quiet spell is busy at the sixth (a fifth took a dozen, each of
	// them a claim of its own, which at 150 commits/s over four instances
	// was 15 % of a 20 s burst's claims), one pause of maxInterval lifts
	// the mean past 300 ms, and at 10 commits/s over four instances fewer
	// than 0.5 % of wake-ups count as busy (a simulation; a fifth: 0.01 %).
	l.mean = (2*l.mean + dt) / 3
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

// enter makes the caller the process's pending drain, unless there is
// one: then it returns nil.
func (l *localTurn) enter() *pendingDrain {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending != nil {
		return nil
	}
	l.pending = &pendingDrain{l: l}
	return l.pending
}

// waiting reports whether the process has a pending drain.
func (l *localTurn) waiting() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending != nil
}

// leave gives the pending place up, if p still holds it. It is safe to
// call more than once, and on nil.
func (p *pendingDrain) leave() {
	if p == nil {
		return
	}
	p.l.mu.Lock()
	defer p.l.mu.Unlock()
	if p.l.pending == p {
		p.l.pending = nil
	}
}
