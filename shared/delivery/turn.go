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
// which waits for the drain that is next before it, if any
// (store.QueueTurn), and returns holding the next turn; a later one, when
// it goes on after a batch, takes the next turn if free, and otherwise
// leaves what is left to the drain that is next (store.TakeTurn).
func (s *Service) takeTurn(ctx context.Context, st *store.Store, first bool) (*store.Turn, error) {
	if !first {
		return st.TakeTurn(ctx, s.cfg.TurnWait)
	}
	return st.QueueTurn(ctx, s.cfg.TurnWait)
}

// awaitTurn readies a turn for its claim. A drain that holds the next
// turn gathers commits for Config.Gather, when gather says so (its first
// claim), so that one batch takes the commits of several wake-ups: the
// workspace is busy (Drain takes turns only then). Its claim then waits
// for the turn, if another drain still holds it (store.Turn.Claim). Until
// the claim, wake-ups of this process are coalesced into it without a
// statement (it is the process's pending drain). It stops being pending
// before it returns, and so before its claim: a wake-up from then on is
// not counted on it.
func (s *Service) awaitTurn(ctx context.Context, turn *store.Turn, pending *pendingDrain, gather bool) error {
	defer pending.leave()
	if !gather || !turn.HoldsNext() || s.cfg.Gather <= 0 {
		return nil
	}
	timer := time.NewTimer(s.cfg.Gather)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		turn.End(ctx)
		return context.Cause(ctx)
	case <-timer.C:
	}
	return nil
}

// claimTurn claims on a turn (store.Turn.Claim), whose first statement
// waits for the turn when another drain still holds it, and counts how
// long the drain waited. While that claim is out, the process counts the
// drain as one that claims soon (localTurn.claimsSoon): it holds a
// connection of the pool and claims as soon as the turn is free, so a
// drain that holds the turn leaves it the events behind its batch (see
// publishClaim).
func (s *Service) claimTurn(ctx context.Context, turn *store.Turn, local *localTurn, res *DrainResult) (store.State, store.Target, *store.Claim, error) {
	if turn.Role() == store.TurnNext {
		defer local.claimOut()()
	}
	state, target, claim, err := turn.Claim(ctx)
	res.Waited += turn.Waited()
	return state, target, claim, err
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
// claims after the wake-up looked, so after its commit), the drains whose
// claim waits for the turn, and how often the workspace's wake-ups come.
type localTurn struct {
	mu      sync.Mutex
	pending *pendingDrain
	// claiming counts the drains of the process whose claim was sent and
	// may wait for the turn (claimTurn): no wake-up is counted on them.
	claiming int
	// last is when the last wake-up of the workspace reached this
	// process, and mean the mean time between them (exponentially
	// weighted; at most maxInterval).
	last       time.Time
	mean       time.Duration
	meanLoaded bool
}

// pendingDrain is a drain's hold on its process's pending place: it holds
// it from enter until leave. The wake-ups coalesced into it (joined) were
// answered on its word: it claims after them.
type pendingDrain struct {
	l *localTurn
	// joined counts the wake-ups coalesced into it; retrying reports that
	// it waits to queue again after a transient fault (a wake-up that
	// finds it so is answered 503, and its commit still left to it).
	// Guarded by l.mu.
	joined   int
	retrying bool
}

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

// enterOrJoin makes the caller the process's pending drain or, when there
// is one, coalesces the caller's wake-up into it (joined), saying whether
// that drain is retrying after a transient fault.
func (l *localTurn) enterOrJoin() (p *pendingDrain, joined, retrying bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending != nil {
		l.pending.joined++
		return nil, true, l.pending.retrying
	}
	l.pending = &pendingDrain{l: l}
	return l.pending, false, false
}

// join coalesces a wake-up into the process's pending drain, if there is
// one (a quiet wake-up's check: see Drain).
func (l *localTurn) join() (joined, retrying bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending == nil {
		return false, false
	}
	l.pending.joined++
	return true, l.pending.retrying
}

// waiting reports whether the process has a pending drain.
func (l *localTurn) waiting() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending != nil
}

// claimOut counts a drain whose claim may wait for the turn until the
// function it returns is called.
func (l *localTurn) claimOut() (done func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.claiming++
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.claiming--
	}
}

// claimsSoon reports whether a drain of the process will claim as soon as
// the turn is free: its pending drain, or one whose claim waits for the
// turn. Unlike waiting, it must not be used to coalesce a wake-up.
func (l *localTurn) claimsSoon() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending != nil || l.claiming > 0
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

// holds reports whether p holds the pending place.
func (p *pendingDrain) holds() bool {
	if p == nil {
		return false
	}
	p.l.mu.Lock()
	defer p.l.mu.Unlock()
	return p.l.pending == p
}

// leaveIfAlone gives the pending place up if no wake-up was coalesced
// into p, and reports whether it did: a drain that leaves its place then
// breaks no wake-up's word (see drainTurns).
func (p *pendingDrain) leaveIfAlone() bool {
	p.l.mu.Lock()
	defer p.l.mu.Unlock()
	if p.joined > 0 {
		return false
	}
	if p.l.pending == p {
		p.l.pending = nil
	}
	return true
}

// setRetrying marks p as waiting to queue again after a transient fault,
// or no longer.
func (p *pendingDrain) setRetrying(on bool) {
	p.l.mu.Lock()
	defer p.l.mu.Unlock()
	p.retrying = on
}
