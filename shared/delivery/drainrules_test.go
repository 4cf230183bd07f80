package delivery

import (
	"testing"
	"time"
)

// TestNextStep specifies the drainer's rules (nextStep), one row a rule;
// it needs no database.
func TestNextStep(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	later, earlier := now.Add(time.Second), now.Add(-time.Second)
	quiet := func(s drainState) drainState { s.Now, s.MaxOut = now, 4; return s }
	busy := func(s drainState) drainState { s = quiet(s); s.Busy = true; return s }
	legacy := func(s drainState) drainState { s = quiet(s); s.Legacy = true; return s }
	for _, tc := range []struct {
		name  string
		state drainState
		want  drainStep
	}{
		// What is owed.
		{"nothing owed, nothing out: it stops", quiet(drainState{}), drainStep{Kind: stepStop}},
		{"a wake-up after its last claim: it claims", quiet(drainState{Wanted: true}), drainStep{Kind: stepClaim}},
		{"its claim left more pending: it claims", quiet(drainState{More: true}), drainStep{Kind: stepClaim}},
		{"a lone event failed: the batch beside it at once", quiet(drainState{Probe: true}), drainStep{Kind: stepClaim}},

		// Batches out and ended.
		{"a batch out, nothing owed: it waits for the publish", quiet(drainState{Out: 1}), drainStep{Kind: stepWait}},
		{"a batch ended, nothing owed: it finishes it", quiet(drainState{Out: 1, Ended: 1}), drainStep{Kind: stepFinish}},
		{"a claim owed and a batch ended: one round trip does both", quiet(drainState{Wanted: true, Ended: 1}), drainStep{Kind: stepClaim}},
		{"a claim owed beside batches out: it claims while they publish", quiet(drainState{Wanted: true, Out: 3}), drainStep{Kind: stepClaim}},
		{"MaxOut batches out: the claim waits for a publish", quiet(drainState{Wanted: true, Out: 4}), drainStep{Kind: stepWait}},
		{"MaxOut out and one ended: it finishes it, then claims", quiet(drainState{Wanted: true, Out: 4, Ended: 1}), drainStep{Kind: stepFinish}},

		// A fault: a backoff, then a claim; never a stop.
		{"a fault backing off: it waits for its end", quiet(drainState{Fault: true, RetryAt: later}), drainStep{Kind: stepWait, Until: later}},
		{"a fault backing off holds a wanted claim back", quiet(drainState{Fault: true, Wanted: true, RetryAt: later}), drainStep{Kind: stepWait, Until: later}},
		{"a fault whose backoff passed: it claims again", quiet(drainState{Fault: true, RetryAt: earlier}), drainStep{Kind: stepClaim}},
		{"a fault backing off, a batch ended: it finishes it", quiet(drainState{Fault: true, RetryAt: later, Ended: 1}), drainStep{Kind: stepFinish}},

		// Events other claims hold: looked at again after a backoff.
		{"events held, backing off: it waits", quiet(drainState{Held: true, RetryAt: later}), drainStep{Kind: stepWait, Until: later}},
		{"events held, backoff passed: it claims again", quiet(drainState{Held: true, RetryAt: earlier}), drainStep{Kind: stepClaim}},
		{"events held, a wake-up: it claims at once", quiet(drainState{Held: true, RetryAt: later, Wanted: true}), drainStep{Kind: stepClaim}},

		// A busy workspace: the turns and the gathering.
		{"busy: it takes the next turn first", busy(drainState{Wanted: true}), drainStep{Kind: stepQueue}},
		{"busy, a batch ended: it finishes it before the wait for the turn", busy(drainState{Wanted: true, Ended: 1, Out: 1}), drainStep{Kind: stepFinish}},
		{"busy, a batch out: it waits for its publish before the wait for the turn", busy(drainState{Wanted: true, Out: 1, AckBy: later}), drainStep{Kind: stepWait, Until: later}},
		{"busy, a batch out past AckBy: it takes the next turn", busy(drainState{Wanted: true, Out: 1, AckBy: earlier}), drainStep{Kind: stepQueue}},
		{"busy, holding the next turn: it gathers", busy(drainState{Wanted: true, HoldsNext: true, GatherUntil: later}), drainStep{Kind: stepWait, Until: later}},
		{"busy, gathered: it claims on its turn", busy(drainState{Wanted: true, HoldsNext: true, GatherUntil: earlier}), drainStep{Kind: stepClaim}},
		{"busy, MaxOut out: no turn while it could not claim", busy(drainState{Wanted: true, Out: 4}), drainStep{Kind: stepWait}},
		{"busy, nothing owed while it holds the next turn: it lets it go", busy(drainState{HoldsNext: true}), drainStep{Kind: stepLeaveTurn}},

		// Protocol 3: one batch at a time, no turns of its own (its claim takes the turn).
		{"protocol 3: a claim, on no turn", legacy(drainState{Wanted: true, Busy: true}), drainStep{Kind: stepClaim}},
		{"protocol 3: one batch at a time", legacy(drainState{Wanted: true, Out: 1}), drainStep{Kind: stepWait}},
		{"protocol 3: the batch finished before the next claim", legacy(drainState{Wanted: true, Ended: 1}), drainStep{Kind: stepFinish}},

		// The process stops: what was promised is still claimed, within
		// the grace; once the grace has run out, nothing is.
		{"stopping: a claim owed is still made", quiet(drainState{Stopping: true, Wanted: true, More: true}), drainStep{Kind: stepClaim}},
		{"stopping: no gathering before it", busy(drainState{Stopping: true, Wanted: true, HoldsNext: true, GatherUntil: later}), drainStep{Kind: stepClaim}},
		{"stopping: nothing owed, the batches out are published", quiet(drainState{Stopping: true, Out: 2}), drainStep{Kind: stepWait}},
		{"stopping: the ended ones are finished", quiet(drainState{Stopping: true, Ended: 2}), drainStep{Kind: stepFinish}},
		{"stopping: a fault's backoff is waited for", quiet(drainState{Stopping: true, Fault: true, RetryAt: later}), drainStep{Kind: stepWait, Until: later}},
		{"stopping, nothing owed or out: it ends", quiet(drainState{Stopping: true}), drainStep{Kind: stepStop}},
		{"abandoned: no claim, though one is owed", quiet(drainState{Stopping: true, Abandoned: true, Wanted: true, More: true}), drainStep{Kind: stepStop}},
		{"abandoned: a held next turn is let go", busy(drainState{Stopping: true, Abandoned: true, Wanted: true, HoldsNext: true}), drainStep{Kind: stepLeaveTurn}},
		{"abandoned: no backoff is waited for", quiet(drainState{Stopping: true, Abandoned: true, Fault: true, RetryAt: later}), drainStep{Kind: stepStop}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := nextStep(tc.state); got != tc.want {
				t.Errorf("nextStep(%+v) = %+v, want %+v", tc.state, got, tc.want)
			}
		})
	}
}
