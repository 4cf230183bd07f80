package main

import (
	"context"
	"sync"
	"time"

	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// promiseChecker checks a wake-up's promise live (SPEC §3): whenever no
// drain can be carrying one (quiescent: at the SDK's pauses, once the
// drainers have ended), every promised wake-up's commit must have been
// published, or be held by a claim (an operation's, the sweep's) or set
// aside (judgeQuiescent). Checked this way, a drain that answers
// wake-ups and never claims, or one that lets a wake-up join after its
// claim, fails at the first such moment.
type promiseChecker struct {
	c *chaosRun

	mu       sync.Mutex
	checks   int // quiescent moments judged
	promised int // promised wake-ups found delivered
	excused  int
	stranded []strandedCommit
}

// run checks every 100 ms until ctx ends (the faults' end), and then
// once more when every wake-up has ended.
func (p *promiseChecker) run(ctx context.Context) {
	last := int64(-1)
	sandbox.Every(ctx, 100*time.Millisecond, func() { p.check(ctx, &last) })
}

// final checks once more after the run: it waits, a minute at most, for
// every wake-up and every drainer to end.
func (p *promiseChecker) final(ctx context.Context) {
	for deadline := time.Now().Add(time.Minute); !p.quiescent() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond) // the requests' and drainers' own ends: the signal is the counters
	}
	last := int64(-1)
	p.check(ctx, &last)
}

// check judges the promise if no wake-up is in flight now and none started
// since the last check (last is the wake-ups started then).
func (p *promiseChecker) check(ctx context.Context, last *int64) {
	wl := &p.c.wakes
	started := wl.Started.Load()
	if !p.quiescent() || started == *last {
		return
	}
	t := time.Now()
	open := wl.Open(t)
	if len(open) == 0 {
		*last = started
		return
	}
	stranded, err := strandedAmong(ctx, p.c.l, open)
	if err != nil || !p.quiescent() || wl.Started.Load() != started {
		return // not quiescent throughout: judged at the next pause
	}
	*last = started
	published := func(id string) bool { _, ok := p.c.l.Published.FirstOf(id); return ok }
	p.judge(t, open, stranded, published, p.c.nemesis.excusals())
}

// judge records one quiescent moment's verdict on the open wake-ups (see
// judgeQuiescent): the delivered ones count as promised and the stranded
// ones as broken, each once (both are resolved, not looked at again); the
// held ones stay open for the next moment.
func (p *promiseChecker) judge(t time.Time, open []*sandbox.WakeRecord, stranded map[string]bool, published func(string) bool, excused excusals) {
	v := judgeQuiescent(t, open, stranded, published, excused)
	p.c.wakes.Resolve(v.Resolved)
	p.c.wakes.Resolve(v.Broken)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.checks++
	p.promised += len(v.Resolved)
	p.excused += v.Excused
	p.stranded = append(p.stranded, v.Stranded...)
}

// judged is how many times the promise was judged so far.
func (p *promiseChecker) judged() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.checks
}

// quiescent reports that no drain can be carrying a promise: no wake-up
// request is in flight, no drainer runs in any instance (the product's
// own lines: a drainer starts with a 2xx answer that was not coalesced and
// ends with its delivery.LogDrainRun line), and no drain fault is under
// way (a freeze, a stop or a kill, whose promises the fault may excuse
// only once it is recorded).
func (p *promiseChecker) quiescent() bool {
	for i, proc := range p.c.l.DrainProcs {
		if p.c.wakes.PerDrain[i].Load() != 0 || proc.Running.Load() > 0 || p.c.nemesis.holds(i) {
			return false
		}
	}
	return true
}

// strandedAmong returns the open wake-ups' events that nothing carries.
func strandedAmong(ctx context.Context, l *sandbox.Local, open []*sandbox.WakeRecord) (map[string]bool, error) {
	var ids []string
	for _, w := range open {
		ids = append(ids, w.HistoryIDs...)
	}
	return sdkfixture.Uncarried(ctx, l.Ontology, l.Gen.Generation, ids)
}
