package main

import (
	"context"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/segmentstream/ontology-replication/shared/testbench/faultproxy"
	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
)

// The claim race: a wake-up that reaches an instance just after its
// pending drain claimed. The drain must have left its pending place before
// its claim, so that the wake-up starts (or joins) a drain that claims
// after its commit; a drain that lets a wake-up join it after its claim
// answers the wake-up 2xx and never takes its commit (SPEC §4: a 2xx is a
// promise). The SDK's bursts meet that moment rarely, and when they do the
// next wake-up's drain takes the commit within milliseconds, so a
// stranded commit is seen only at a burst's very end. The race makes the
// moment in the pauses of the SDK's traffic, as often as they allow:
//
//  1. It picks an instance with nothing in flight and no fault on it, and
//     commits a quick run of changes, each woken there as the SDK wakes
//     (claimRaceWarmUps: enough for the instance to count the workspace as
//     busy, so that its wake-ups coalesce).
//  2. It holds, at the drains' Pub/Sub proxy, the first Publish that
//     carries the last of them (faultproxy.GRPC.HoldNext): the drain that
//     publishes it has claimed.
//  3. While that Publish is held it commits one more change and wakes the
//     same instance, then lets the Publish go once the wake-up is answered
//     or claimRaceHold has passed. Every third race loses it instead
//     (faultproxy.Hold.Lose: never forwarded, answered DEADLINE_EXCEEDED,
//     as a publish whose answer never came): the drain must publish those
//     events again and never acknowledge them unpublished, which the
//     live checks see within a second.
//
// The promise's checks judge it, before the next race, as any wake-up
// (a race after it would take its commit if it was stranded).
type claimRace struct {
	c     *chaosRun
	sends sync.WaitGroup

	mu sync.Mutex
	// sent counts the wake-ups sent while the claim before them was held,
	// and atOnce those of them answered 2xx before it was let go (a
	// wake-up that starts a drain cannot be: its drain waits for the held
	// one's turn).
	sent, atOnce int
	// lost counts the races whose held Publish was lost (claimRaceLoseEvery).
	lost int
	// skipped counts, by reason, the pauses the race could not use.
	skipped map[string]int
}

// claimRaceWarmUps is how many commits the race wakes an instance for,
// one right after another: from a pause, an instance counts a workspace as
// busy after about half a dozen wake-ups (delivery's quiet interval).
const claimRaceWarmUps = 12

// claimRaceHold is the longest the race holds a claim's Publish once its
// wake-up is sent: a wake-up coalesced into a drain is answered at once; one
// that starts a drain waits for the held one's turn.
const claimRaceHold = 300 * time.Millisecond

// claimRaceLoseEvery: every this many races, the held Publish is lost.
const claimRaceLoseEvery = 3

// claimRaceLeast is the least of a pause the race starts in.
const claimRaceLeast = 700 * time.Millisecond

// run makes races in the pauses of the SDK's traffic, each judged before
// the next, until ctx ends, and waits for its wake-ups' answers.
func (r *claimRace) run(ctx context.Context) {
	defer r.sends.Wait()
	c := r.c
	rng := rand.New(rand.NewPCG(c.cfg.seed, 0x72616365))
	var ids []string
	wk := &sandbox.LocalWriter{L: c.l, Rng: rng, Ww: c.l.Writer.OnCommit(func(h []string) { ids = h })}
	commit := func(drain int) (*sandbox.WakeRecord, error) {
		ids = nil
		if _, err := c.commitOnce(ctx, wk); err != nil {
			return nil, err
		}
		c.commits.Add(1)
		c.l.Commits.Add(1)
		return c.wakeRecordOf(ids, time.Now(), drain), nil
	}
	for ctx.Err() == nil {
		if !r.awaitPause(ctx) {
			return
		}
		if why := r.race(ctx, rng, commit); why != "" {
			r.skip(why)
			r.awaitNextPause(ctx)
			continue
		}
		// Another race now would take this one's commit if it was
		// stranded: the promise is judged first.
		r.awaitJudged(ctx, c.promise.judged())
	}
}

// skip counts a pause the race could not use.
func (r *claimRace) skip(why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.skipped == nil {
		r.skipped = map[string]int{}
	}
	r.skipped[why]++
}

// summary is what the race did, for the report.
func (r *claimRace) summary() claimRaceSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	return claimRaceSummary{Sent: r.sent, AnsweredAtOnce: r.atOnce, Lost: r.lost, Skipped: maps.Clone(r.skipped)}
}

// awaitNextPause waits until the SDK's current pause is over.
func (r *claimRace) awaitNextPause(ctx context.Context) {
	c := r.c
	if busy, until := c.traffic.busy(time.Since(c.started)); !busy {
		sandbox.SleepUntil(ctx, c.started.Add(until))
	}
}

// awaitJudged waits until the promise was judged more than n times (a
// check after the race's wake-ups ended), or the pause is over.
func (r *claimRace) awaitJudged(ctx context.Context, n int) {
	c := r.c
	for ctx.Err() == nil && c.promise.judged() <= n {
		if busy, _ := c.traffic.busy(time.Since(c.started)); busy {
			return
		}
		time.Sleep(10 * time.Millisecond) // the checker's count is the signal
	}
}

// awaitPause waits until the SDK pauses with no drain able to run (no
// wake-up in flight but to a frozen instance) and at least claimRaceLeast
// of the pause left (false when ctx ended first).
func (r *claimRace) awaitPause(ctx context.Context) bool {
	c := r.c
	for ctx.Err() == nil {
		busy, until := c.traffic.busy(time.Since(c.started))
		switch {
		case busy:
			if !c.traffic.awaitBusy(ctx, c.started) {
				return false
			}
			sandbox.SleepUntil(ctx, c.started.Add(until))
		case until-time.Since(c.started) < claimRaceLeast:
			sandbox.SleepUntil(ctx, c.started.Add(until))
		case c.promise.quiescent():
			return true
		default:
			time.Sleep(10 * time.Millisecond) // the in-flight counters are the signal
		}
	}
	return false
}

// race makes one claim race (see claimRace): it returns why it could not
// send its wake-up while the claim before it was held ("" when it did).
func (r *claimRace) race(ctx context.Context, rng *rand.Rand, commit func(int) (*sandbox.WakeRecord, error)) string {
	c := r.c
	drain, ok := r.idleInstance(rng)
	if !ok {
		return "no instance idle and free of faults"
	}
	if !wires.pubsub.TryLock() {
		return "Pub/Sub's wire faulted"
	}
	defer wires.pubsub.Unlock()
	token, err := c.token.get()
	if err != nil {
		return "no token"
	}
	url := c.l.Urls.Drains[drain]
	var hold *faultproxy.Hold
	for k := range claimRaceWarmUps {
		rec, err := commit(drain)
		if err != nil {
			return "a commit failed"
		}
		if k == claimRaceWarmUps-1 {
			hold = c.l.PubsubProxies[sandbox.ComponentDrain].HoldNext(publishCarries(rec.EventIDs))
			defer hold.Release()
		}
		r.sends.Go(func() { c.wakes.Send(ctx, c.l, url, token, rec) })
	}
	select {
	case <-hold.Held():
	case <-time.After(5 * time.Second):
		return "no drain published the last commit within 5 s"
	case <-ctx.Done():
		return "the run ended"
	}
	rec, err := commit(drain)
	if err != nil {
		return "a commit failed"
	}
	answered := make(chan struct{})
	r.sends.Go(func() {
		defer close(answered)
		c.wakes.Send(ctx, c.l, url, token, rec)
	})
	timer := time.NewTimer(claimRaceHold)
	defer timer.Stop()
	atOnce := false
	select {
	case <-answered:
		atOnce = rec.Promised()
	case <-timer.C:
	case <-ctx.Done():
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent++
	if atOnce {
		r.atOnce++
	}
	if r.sent%claimRaceLoseEvery == 0 {
		hold.Lose()
		r.lost++
	}
	return ""
}

// idleInstance picks a drain instance with no request in flight, serving
// and not held by a fault.
func (r *claimRace) idleInstance(rng *rand.Rand) (int, bool) {
	c := r.c
	var idle []int
	for i, p := range c.l.DrainProcs {
		if c.wakes.PerDrain[i].Load() == 0 && !p.Frozen.Load() && !c.nemesis.holds(i) {
			idle = append(idle, i)
		}
	}
	if len(idle) == 0 {
		return 0, false
	}
	return idle[rng.IntN(len(idle))], true
}

// publishCarries matches a Publish request that carries any of the events
// (wire ids).
func publishCarries(eventIDs []string) func(request []byte) bool {
	return func(request []byte) bool {
		return slices.ContainsFunc(sandbox.PublishedEventIDs(request), func(id string) bool { return slices.Contains(eventIDs, id) })
	}
}
