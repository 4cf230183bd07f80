package delivery

import "time"

// The drainer's rules: what it does next, from what it knows (see
// drainer). They are a pure function, so that each rule has one home and
// a table test (drainrules_test.go) that needs no database; the loop that
// performs the steps is drainRun.loop.

// drainState is what a drainer knows when it chooses its next step.
type drainState struct {
	Now time.Time
	// Stopping: the process stops (Service.Shutdown): no wake-up is
	// counted any more, but what was promised is still claimed, at once
	// (no gathering), published and finished, within the grace (SPEC §3:
	// on SIGTERM the drain ends its work within the grace period).
	Stopping bool
	// Abandoned: the grace ran out: nothing is claimed or waited for; the
	// batches out were released unacknowledged.
	Abandoned bool
	// Wanted: a wake-up came after the drainer's last claim began (or
	// before its first): a claim is owed to it.
	Wanted bool
	// Busy: the workspace's wake-ups reach this process often
	// (Config.QuietInterval): the drainers of every process take turns,
	// each gathering before it claims, each claim for many commits.
	Busy bool
	// Legacy: protocol 3, whose claims hold the turn to their end: one
	// batch at a time.
	Legacy bool
	// Out is how many batches are being published, Ended how many were
	// published and wait to be finished (acknowledged, set aside or
	// released); MaxOut bounds Out.
	Out, Ended, MaxOut int
	// More: the last claim took a full batch and more was pending.
	More bool
	// Held: the last claim found pending events other claims hold: looked
	// at again after a backoff (RetryAt), in case their holder never
	// publishes them (its process froze, or it let them go).
	Held bool
	// Probe: an event published alone failed, as an event of its own may
	// (see suspects): the batch beside it is claimed at once.
	Probe bool
	// Fault: the last claim, publish or finish failed: the drainer claims
	// again at RetryAt, and answers wake-ups 503 until a step succeeds.
	Fault bool
	// RetryAt ends the backoff of a Fault, or of Held.
	RetryAt time.Time
	// HoldsNext: the drainer holds the workspace's next turn (Busy), and
	// gathers until GatherUntil before it claims.
	HoldsNext   bool
	GatherUntil time.Time
	// AckBy: a busy drainer with batches out waits for their publishes
	// until AckBy (its last claim and Config.Gather) before it takes the
	// next turn, so that it acknowledges them before that wait, which may
	// last several drainers' gatherings, rather than after.
	AckBy time.Time
}

// stepKind is what the drainer does next.
type stepKind int

const (
	stepStop      stepKind = iota // nothing owed, out or to finish: end (unless a wake-up came: drainer.stop)
	stepFinish                    // finish the ended batches, without a claim
	stepQueue                     // take the next turn, waiting in the server for the drainer ahead
	stepClaim                     // finish the ended batches and claim the next, in one round trip
	stepLeaveTurn                 // let the turns go without a claim
	stepWait                      // wait until Until (zero: no timer), a publish's end, or a wake-up
)

// drainStep is a drainer's next step.
type drainStep struct {
	Kind  stepKind
	Until time.Time
}

// nextStep is the drainer's rules. The one that carries the promise: the
// drainer stops only when no claim is owed — every wake-up it answered came
// before a claim it made, and no claim left more, held events or a fault
// behind — and nothing is out or to finish.
func nextStep(s drainState) drainStep {
	backingOff := s.Now.Before(s.RetryAt)
	owed := s.Wanted || s.More || s.Probe || s.Fault || s.Held
	// A fault holds every claim back until its backoff has passed; held
	// events are looked at again only then.
	mayClaim := !s.Abandoned && owed && !(s.Fault && backingOff) &&
		(s.Wanted || s.More || s.Probe || !backingOff)
	room := s.Out < s.MaxOut && !(s.Legacy && s.Out+s.Ended > 0)
	switch {
	case s.HoldsNext && !mayClaim:
		return drainStep{Kind: stepLeaveTurn}
	case mayClaim && room && s.Busy && !s.Legacy && !s.HoldsNext && s.Ended > 0:
		// The wait for the turn may last several drainers' gatherings:
		// what Pub/Sub accepted is acknowledged first.
		return drainStep{Kind: stepFinish}
	case mayClaim && room && s.Busy && !s.Legacy && !s.HoldsNext && s.Out > 0 && s.Now.Before(s.AckBy) && !s.Stopping:
		// So are the batches out whose publish ends before AckBy.
		return drainStep{Kind: stepWait, Until: s.AckBy}
	case mayClaim && room && s.Busy && !s.Legacy && !s.HoldsNext:
		return drainStep{Kind: stepQueue}
	case mayClaim && room && s.HoldsNext && s.Now.Before(s.GatherUntil) && !s.Stopping:
		return drainStep{Kind: stepWait, Until: s.GatherUntil}
	case mayClaim && room:
		return drainStep{Kind: stepClaim}
	case s.Ended > 0:
		return drainStep{Kind: stepFinish}
	case s.Out > 0:
		return drainStep{Kind: stepWait}
	case !s.Abandoned && owed && backingOff:
		return drainStep{Kind: stepWait, Until: s.RetryAt}
	}
	return drainStep{Kind: stepStop}
}
