package main

import (
	"fmt"
	"slices"
	"time"

	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
)

// The wake-up path's proofs (SPEC §4: a wake-up's 2xx is a promise). They
// are pure functions of what the run recorded, so that their tests can
// hand them fabricated wake-ups and publishes and require them to fail.

// window is a fault of one drain instance: its process killed, frozen,
// or stopped leaving work it said it left (delivery.LogDrainLeft), at From.
type window struct {
	Kind  string
	Drain int // the instance's index
	From  time.Time
}

// excusals are the faults that may break a promise, by the SPEC's own
// words (§3: "its commit is published by a drain that is alive … whatever
// that drain meets"): the promising process killed, frozen, or stopped by
// the platform with work left (a stop claims what was promised: only one
// whose grace ran out leaves work, and says so, delivery.LogDrainLeft),
// after its answer. Nothing in a process's memory outlives that. Nothing else excuses a broken promise: not a fault
// of another instance, not a fault's aftermath, not Pub/Sub, BigQuery or
// the database.
type excusals []window

// covers reports whether a fault of instance drain came after a promise it
// answered at answered and no later than t, when the promise was judged.
func (e excusals) covers(drain int, answered, t time.Time) bool {
	for _, w := range e {
		if w.Drain == drain && w.From.After(answered) && !w.From.After(t) {
			return true
		}
	}
	return false
}

// strandedCommit is a promised wake-up whose commit was found pending with
// no drain in flight: nothing was carrying it.
type strandedCommit struct {
	EventID  string
	Drain    int
	Answered time.Time
	Found    time.Time
}

// quiescentVerdict is one check of the promise at a moment no wake-up was
// in flight.
type quiescentVerdict struct {
	Stranded []strandedCommit
	Excused  int
	// Resolved are the wake-ups whose events were all published (or
	// excused), and Broken those with a stranded event: neither needs
	// another check.
	Resolved, Broken []*sandbox.WakeRecord
}

// judgeQuiescent checks the promise at t, a moment when no wake-up request
// was in flight and no drainer ran in any instance: every event of each
// promised wake-up answered before t (open) must have been published
// (published says, by wire id), unless it is held (a claim of an
// operation's or the sweep's holds it, or it is set aside). stranded are
// the open wake-ups' events (history ids) found pending, not held and not
// set aside. A stranded event whose promising process was killed, frozen
// or stopped with work left between its answer and t is excused (see
// excusals); any other breaks the promise.
func judgeQuiescent(t time.Time, open []*sandbox.WakeRecord, stranded map[string]bool, published func(eventID string) bool, excused excusals) quiescentVerdict {
	var v quiescentVerdict
	for _, w := range open {
		done, broken := true, false
		for i, h := range w.HistoryIDs {
			switch {
			case published(w.EventIDs[i]):
			case stranded[h] && excused.covers(w.Drain, w.Answered, t):
				v.Excused++
			case stranded[h]:
				v.Stranded = append(v.Stranded, strandedCommit{EventID: w.EventIDs[i], Drain: w.Drain, Answered: w.Answered, Found: t})
				broken = true
			default:
				done = false // held by a claim, or set aside: looked at again
			}
		}
		switch {
		case broken:
			v.Broken = append(v.Broken, w)
		case done:
			v.Resolved = append(v.Resolved, w)
		}
	}
	return v
}

// pathReport is how the events got to Pub/Sub first: by the wake-ups'
// drains, by operations (a replay's or `job drain`'s drain), or by the
// verifier's sweep, and the delivery lag of the promised ones.
type pathReport struct {
	ByWakeUps, ByOperations, BySweep int
	// SweptPromised are events of promised wake-ups that the sweep
	// published first, outside the drain's own faults, when no wake-up
	// request to their instance that was open at their answer was in
	// flight any more: the drain they rested on had ended without them.
	// SweptRacing counts those the sweep took while such a request was
	// still in flight (its drain between retries, say): a race with the
	// drain carrying them, not a broken promise.
	SweptPromised []string
	SweptRacing   int
	// Lags are commit → first publish of the promised wake-ups' events,
	// outside the drain's own faults; Late those past the bound.
	Lags []time.Duration
	Late []string
}

// judgePath attributes every promised or unpromised commit's events to what
// published them first (first, by wire id; components as the proxies name
// them) and checks that a promised commit was published by a drain, within
// bound of its commit, unless a drain's own fault excuses it.
func judgePath(wakes []sandbox.WakeRecord, first map[string]sandbox.FirstPublish, excused excusals, bound time.Duration) pathReport {
	var r pathReport
	byDrain := requestsByDrain(wakes)
	for _, w := range wakes {
		for _, id := range w.EventIDs {
			f, ok := first[id]
			if !ok {
				continue // never published: the "none lost" proof's
			}
			switch f.Component {
			case sandbox.ComponentDrain:
				r.ByWakeUps++
			case sandbox.ComponentJob:
				r.ByOperations++
			default:
				r.BySweep++
			}
			if !w.Promised() || excused.covers(w.Drain, w.Answered, f.At) {
				continue
			}
			lag := f.At.Sub(w.Committed)
			r.Lags = append(r.Lags, lag)
			swept := f.Component == sandbox.ComponentVerify && !inFlightAt(byDrain[w.Drain], w.Answered, f.At)
			switch {
			case f.Component == sandbox.ComponentVerify && !swept:
				r.SweptRacing++
			case swept:
				r.SweptPromised = append(r.SweptPromised, id)
			}
			if lag > bound {
				r.Late = append(r.Late, id)
			}
		}
	}
	return r
}

// requestsByDrain groups the wake-up requests by instance.
func requestsByDrain(wakes []sandbox.WakeRecord) map[int][]sandbox.WakeRecord {
	out := map[int][]sandbox.WakeRecord{}
	for _, w := range wakes {
		out[w.Drain] = append(out[w.Drain], w)
	}
	return out
}

// inFlightAt reports whether one of an instance's wake-up requests that
// was open at answered (sent by then, not ended before) was still in
// flight at t: a drain that may carry a commit answered then.
func inFlightAt(requests []sandbox.WakeRecord, answered, t time.Time) bool {
	for _, q := range requests {
		if !q.Sent.After(answered) && (q.Ended.IsZero() || !q.Ended.Before(t)) {
			return true
		}
	}
	return false
}

// describeStranded names the first stranded commits for a proof's line.
func describeStranded(s []strandedCommit) string {
	if len(s) == 0 {
		return ""
	}
	first := s[0]
	return fmt.Sprintf(" (for example event %s, answered 2xx by drain %d, pending with no drain in flight %.1fs later)",
		first.EventID, first.Drain+1, first.Found.Sub(first.Answered).Seconds())
}

// describePathBreak names the first event that broke the path's proof
// (swept, then late), with its timeline in seconds from started: its
// commit, its wake-up's answer, its first publish, and the last end of
// the requests to its instance that were open at the answer.
func describePathBreak(swept, late []string, wakes []sandbox.WakeRecord, first map[string]sandbox.FirstPublish, started time.Time) string {
	ids := append(slices.Clone(swept), late...)
	if len(ids) == 0 {
		return ""
	}
	id := ids[0]
	at := func(t time.Time) float64 { return t.Sub(started).Seconds() }
	for _, w := range wakes {
		if !slices.Contains(w.EventIDs, id) {
			continue
		}
		var lastEnd time.Time
		for _, q := range wakes {
			if q.Drain == w.Drain && !q.Sent.After(w.Answered) && q.Ended.After(lastEnd) {
				lastEnd = q.Ended
			}
		}
		f := first[id]
		return fmt.Sprintf(" (for example event %s: committed at %.1fs, answered %d by drain %d at %.1fs, published first by %s at %.1fs; the drain's requests open at the answer ended by %.1fs)",
			id, at(w.Committed), w.Code, w.Drain+1, at(w.Answered), f.Component, at(f.At), at(lastEnd))
	}
	return " (for example event " + id + ")"
}

// runBreak is a promised wake-up its run did not cover: the run named by
// its answer ended before a claim that came after it (Covered < Wake), or
// never ended, or the answer named no run.
type runBreak struct {
	EventIDs  []string
	Drain     int
	Run, Wake uint64
	Covered   uint64
	Ended     bool
	// Twice: another answer of the same process named the same run and
	// place: the product counts each wake-up once, so one of the two was
	// never counted.
	Twice bool
}

// judgeRuns checks each promised wake-up against the product's own word:
// its answer names the drainer run that carries it and its place among
// the wake-ups (delivery.WakeAnswer), and the run's last line says which
// wake-ups its last claim came after. A promise is kept by its run if the
// run ended having covered it; a run that ended short of it, or never
// ended, broke it, unless its process was killed, frozen or stopped with
// work left after the answer and before the run's end (or the run's
// check, at). A promise answered with no run breaks it too, and so does
// an answer naming the run and place another answer of the same process
// named (the product counts each wake-up once: one of them was never
// counted). ends finds a run's end by instance.
func judgeRuns(wakes []sandbox.WakeRecord, ends func(drain int, k sandbox.RunKey) (sandbox.RunEnd, bool), excused excusals, at time.Time) (broken []runBreak, excusedN int) {
	type place struct {
		drain     int
		start     int64
		run, wake uint64
	}
	answered := map[place]bool{}
	for _, w := range wakes {
		if !w.Promised() || w.Answered.IsZero() {
			continue
		}
		if p := (place{w.Drain, w.Start, w.Run, w.Wake}); w.Run != 0 && !w.Restarted {
			if answered[p] {
				broken = append(broken, runBreak{EventIDs: w.EventIDs, Drain: w.Drain, Run: w.Run, Wake: w.Wake, Twice: true})
				continue
			}
			answered[p] = true
		}
		e, ok := ends(w.Drain, sandbox.RunKey{Start: w.Start, Run: w.Run})
		switch {
		case w.Run == 0:
		case ok && e.Covered >= w.Wake:
			continue
		case ok && excused.covers(w.Drain, w.Answered, e.At), !ok && excused.covers(w.Drain, w.Answered, at):
			excusedN++
			continue
		}
		broken = append(broken, runBreak{EventIDs: w.EventIDs, Drain: w.Drain, Run: w.Run, Wake: w.Wake, Covered: e.Covered, Ended: ok})
	}
	return broken, excusedN
}

// describeRunBreak names the first promise its run did not cover.
func describeRunBreak(b []runBreak) string {
	if len(b) == 0 {
		return ""
	}
	f := b[0]
	switch {
	case f.Run == 0:
		return fmt.Sprintf(" (for example a wake-up of drain %d answered 2xx naming no run)", f.Drain+1)
	case f.Twice:
		return fmt.Sprintf(" (for example wake-up %d of drain %d's run %d: two answers named it)", f.Wake, f.Drain+1, f.Run)
	case !f.Ended:
		return fmt.Sprintf(" (for example wake-up %d of drain %d: its run %d never ended)", f.Wake, f.Drain+1, f.Run)
	}
	return fmt.Sprintf(" (for example wake-up %d of drain %d: its run %d ended after covering %d)", f.Wake, f.Drain+1, f.Run, f.Covered)
}
