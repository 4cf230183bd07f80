package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// published is what Pub/Sub received on the topic: every event id, with
// when each of its messages was stored.
type published struct {
	messages int
	times    map[string][]time.Time
}

// readPublished reads the topic's messages from the Pub/Sub server (what
// it stored, whatever its answers said), each message's event id from its
// JSON.
func readPublished(l *sandbox.Local) published {
	p := published{times: map[string][]time.Time{}}
	for _, m := range l.Pubsub.Messages() {
		if m.Topic != sandbox.LocalTopic {
			continue
		}
		var body struct {
			EventID string `json:"event_id"`
		}
		_ = json.Unmarshal(m.Data, &body)
		p.messages++
		p.times[body.EventID] = append(p.times[body.EventID], m.PublishTime)
	}
	return p
}

// violations are the events that broke a promise, by promise.
type violations struct {
	// AcceptedNotPublished: a delivery row accepted while Pub/Sub holds no
	// message of its event.
	AcceptedNotPublished map[string]bool
	// VerifiedNotLanded: a delivery row verified while the warehouse holds
	// no row of its event.
	VerifiedNotLanded map[string]bool
	// ReceiptsDisagreeing: the most receipts seen disagreeing with their
	// delivery rows at once (sdkfixture.ReceiptMismatches), and one of
	// them.
	ReceiptsDisagreeing int
	ReceiptExample      string
}

// check reads the delivery rows first, then what Pub/Sub stored and what
// landed, so that a row that moved on between the reads is never a false
// alarm: an acknowledgement follows its publish, a verification its
// landing.
func check(ctx context.Context, l *sandbox.Local, v *violations) ([]sdkfixture.DeliveryRow, published, map[string]bool, error) {
	mismatched, example, err := sdkfixture.ReceiptMismatches(ctx, l.Ontology, l.Gen.Generation)
	if err != nil {
		return nil, published{}, nil, err
	}
	if mismatched > v.ReceiptsDisagreeing {
		v.ReceiptsDisagreeing, v.ReceiptExample = mismatched, example
	}
	rows, err := sdkfixture.DeliveryRows(ctx, l.Ontology, l.Gen)
	if err != nil {
		return nil, published{}, nil, err
	}
	pub := readPublished(l)
	landed, err := l.Wh.EventIDs(ctx)
	if err != nil {
		return nil, published{}, nil, err
	}
	judgeRows(rows, pub, landed, v)
	return rows, pub, landed, nil
}

// judgeRows records in v the delivery rows that break a promise, given
// what Pub/Sub stored and what landed, read after the rows: an accepted row
// with no message of its event, a verified one with no row in the
// warehouse.
func judgeRows(rows []sdkfixture.DeliveryRow, pub published, landed map[string]bool, v *violations) {
	for _, r := range rows {
		if r.Accepted && len(pub.times[r.EventID]) == 0 {
			v.AcceptedNotPublished[r.EventID] = true
		}
		if r.Verified && !landed[r.EventID] {
			v.VerifiedNotLanded[r.EventID] = true
		}
	}
}

// liveChecker checks the promises every second while the run goes on, and
// notes the most events set aside at once.
type liveChecker struct {
	l        *sandbox.Local
	mu       sync.Mutex
	found    violations
	checks   int
	setAside int
}

func (c *liveChecker) run(ctx context.Context) {
	sandbox.Every(ctx, time.Second, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		rows, _, _, err := check(ctx, c.l, &c.found)
		if err != nil {
			return
		}
		c.checks++
		aside := 0
		for _, r := range rows {
			if r.SetAside {
				aside++
			}
		}
		c.setAside = max(c.setAside, aside)
	})
}

// deliveryLagBound is the delivery lag past which a promised commit is
// reported late. It is a figure, not a proof: the SPEC (§3) bounds no
// delivery under faults; a drainer that is alive retries for as long as
// they last (a turn held by a frozen instance until the server ends its
// session, a migration holding the lifecycle lock, Pub/Sub hanging, one
// after another), and the run and path proofs hold it to its promise.
const deliveryLagBound = 30 * time.Second

// prove checks every promise once the run is over and fills the report.
func (c *chaosRun) prove(ctx context.Context) error {
	l, rep := c.l, c.report
	n := c.nemesis
	n.mu.Lock()
	rep.Timeline = slices.Clone(n.timeline)
	n.mu.Unlock()
	slices.SortStableFunc(rep.Timeline, func(a, b timelineEntry) int { return cmp.Compare(a.AtSeconds, b.AtSeconds) })
	rep.WakeUps, rep.Answers = c.wakes.Codes(), c.wakes.Answers()
	rep.Faults, rep.FaultsEffective = map[string]int{}, map[string]int{}
	for _, e := range rep.Timeline {
		rep.Faults[e.Kind]++
		if e.Effect > 0 {
			rep.FaultsEffective[e.Kind]++
		}
	}
	c.proveInjected()
	rep.PassesFailed = c.failedPasses.Load()
	c.checker.mu.Lock()
	found, checks := c.checker.found, c.checker.checks
	rep.SetAsideDuringRun = c.checker.setAside
	c.checker.mu.Unlock()
	rep.LiveChecks = checks
	c.promise.final(ctx)
	c.provePromise(n.excusals())
	rows, pub, landed, err := check(ctx, l, &found)
	if err != nil {
		return err
	}
	rep.Published = pub.messages
	rep.Landed, _, err = l.Wh.Counts(ctx)
	if err != nil {
		return err
	}
	var lost []string
	for _, r := range rows {
		if !landed[r.EventID] {
			lost = append(lost, r.EventID)
		}
	}
	rep.Duplicates = pub.messages - len(pub.times)
	rep.DuplicatesReplays = min(c.replayDuplicates(rows, pub), rep.Duplicates)
	rep.DuplicatesFaults = rep.Duplicates - rep.DuplicatesReplays
	rep.add("every captured event verified", rep.FullyVerified,
		fmt.Sprintf("%d of %d verified, %d pending, %d set aside", rep.Verified, rep.Events, rep.Pending, rep.SetAside))
	rep.add("none accepted but never published", len(found.AcceptedNotPublished) == 0,
		fmt.Sprintf("%d events accepted with no message in Pub/Sub (checked %d times during the run and at the end)%s",
			len(found.AcceptedNotPublished), checks+1, example(found.AcceptedNotPublished)))
	rep.add("none verified before it landed", len(found.VerifiedNotLanded) == 0,
		fmt.Sprintf("%d events verified with no row in the warehouse%s", len(found.VerifiedNotLanded), example(found.VerifiedNotLanded)))
	rep.add("receipts agree with the delivery rows", found.ReceiptsDisagreeing == 0,
		fmt.Sprintf("at most %d receipts of pending or unverified events at once%s", found.ReceiptsDisagreeing, example(setOf(nonEmpty(found.ReceiptExample, "history row ")))))
	rep.add("none lost", len(lost) == 0, fmt.Sprintf("%d of %d captured events not in the warehouse%s", len(lost), len(rows), example(setOf(lost))))
	c.proveReplays(rows, pub)
	rep.add("no set-aside event left", rep.SetAside == 0, fmt.Sprintf("%d set aside", rep.SetAside))
	rep.add("every operation finished", len(rep.operationsFailures) == 0, fmt.Sprintf("%d failed %v", len(rep.operationsFailures), rep.operationsFailures))
	l.Progress.Enter("checking the views against the source tables", "")
	if rep.Views, err = l.CheckViews(ctx); err != nil {
		return err
	}
	equal := true
	for _, v := range rep.Views {
		equal = equal && v.Match
	}
	rep.add("views equal to the source, every column", equal, fmt.Sprintf("%d views compared", len(rep.Views)))
	l.Progress.Enter("auditing the warehouse against the source", "")
	audit, err := l.Svc.Audit(ctx, sandbox.LocalWorkspace, delivery.AuditOptions{})
	if err != nil {
		return err
	}
	rep.Audit = &audit
	rep.add("job audit equal", audit.Equal, fmt.Sprintf("as of revision %d, %d differences", audit.Watermark, audit.Differences))
	return nil
}

// replayDuplicates counts the messages the replays sent on purpose: for
// each replay, the events in its scope that had been published before it
// started and were published again after (a pending event it reset was
// published for the first time: no duplicate).
func (c *chaosRun) replayDuplicates(rows []sdkfixture.DeliveryRow, pub published) int {
	n := 0
	for _, r := range c.replays {
		for _, row := range rows {
			if r.scope != nil && !r.scope[row.EventID] {
				continue
			}
			before, after := false, false
			for _, t := range pub.times[row.EventID] {
				before, after = before || t.Before(r.started), after || !t.Before(r.started)
			}
			if before && after {
				n++
			}
		}
	}
	return n
}

// proveReplays checks that each replay sent its events through Pub/Sub
// again: every event in its scope has a message stored after it started
// (the events captured later were published later anyway).
func (c *chaosRun) proveReplays(rows []sdkfixture.DeliveryRow, pub published) {
	for _, r := range c.replays {
		if r.err != nil {
			continue
		}
		var missing []string
		scope := 0
		for _, row := range rows {
			if r.scope != nil && !r.scope[row.EventID] {
				continue
			}
			scope++
			again := false
			for _, t := range pub.times[row.EventID] {
				again = again || !t.Before(r.started)
			}
			if !again {
				missing = append(missing, row.EventID)
			}
		}
		c.report.add(fmt.Sprintf("the %s published its events again", r.kind), len(missing) == 0,
			fmt.Sprintf("%d of %d events in its scope not published after it started%s", len(missing), scope, example(setOf(missing))))
	}
}

func (r *chaosReport) add(name string, ok bool, detail string) {
	r.Proofs = append(r.Proofs, proof{Name: name, OK: ok, Detail: detail})
}

// nonEmpty returns s with prefix, or nothing when s is empty.
func nonEmpty(s, prefix string) []string {
	if s == "" {
		return nil
	}
	return []string{prefix + s}
}

func setOf(ids []string) map[string]bool {
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out
}

// example names the first of ids (in order), for a report line.
func example(ids map[string]bool) string {
	if len(ids) == 0 {
		return ""
	}
	sorted := make([]string, 0, len(ids))
	for id := range ids {
		sorted = append(sorted, id)
	}
	sort.Strings(sorted)
	return " (for example " + sorted[0] + ")"
}

// provePromise adds the wake-up path's proofs: no promised commit stranded
// at a pause (promiseChecker), every promise covered by its run, and every
// promised commit published first by a drain, not by the sweep once the
// drains that could carry it had ended (its own process's faults excused);
// how late they came is reported.
func (c *chaosRun) provePromise(excused excusals) {
	rep := c.report
	p := &c.promise
	p.mu.Lock()
	stranded := slices.Clone(p.stranded)
	rep.Promise = promiseSummary{Pauses: p.checks, Promised: p.promised, Stranded: len(stranded), Excused: p.excused}
	p.mu.Unlock()
	for _, s := range stranded[:min(len(stranded), 5)] {
		rep.Promise.Examples = append(rep.Promise.Examples, strandedExample{EventID: s.EventID, Drain: s.Drain + 1,
			AnsweredSeconds: s.Answered.Sub(c.started).Seconds(), FoundSeconds: s.Found.Sub(c.started).Seconds()})
	}
	rep.ClaimRaces = c.race.summary()
	// Every claimRaceLoseEvery-th race loses its held publish, and the
	// proxy counts what it did lose: a race that reports losses it never
	// made fails here.
	var lostByProxy int64
	if p, ok := c.l.PubsubProxies[sandbox.ComponentDrain]; ok {
		lostByProxy = p.Losses()
	}
	raced := rep.ClaimRaces
	rep.add("the claim race was run", raced.Sent > 0 && raced.Lost >= raced.Sent/claimRaceLoseEvery && lostByProxy >= int64(raced.Lost),
		fmt.Sprintf("%s, each judged with the rest; the proxy lost %d held publishes", raced.String(), lostByProxy))
	wakes, first := c.wakes.Records(), c.l.Published.Snapshot()
	path := judgePath(wakes, first, excused, deliveryLagBound)
	rep.Path = pathSummary{ByWakeUps: path.ByWakeUps, ByOperations: path.ByOperations, BySweep: path.BySweep, SweptRacing: path.SweptRacing,
		LagMaxSecs: sandbox.Quantile(path.Lags, 1).Seconds(), LagP99Secs: sandbox.Quantile(path.Lags, 0.99).Seconds()}
	judged := rep.Promise.Promised + len(stranded) + rep.Promise.Excused
	rep.add("every promised commit published by a drain in flight", len(stranded) == 0 && p.checks > 0,
		fmt.Sprintf("%d wake-ups answered 2xx judged at %d moments with no wake-up or drainer running: %d commits stranded, %d excused (%.1f%%: "+
			"their process killed, frozen or stopped with work left after the answer, SPEC §3)%s",
			judged, p.checks, len(stranded), rep.Promise.Excused, 100*float64(rep.Promise.Excused)/float64(max(judged, 1)), describeStranded(stranded)))
	ends := func(drain int, k sandbox.RunKey) (sandbox.RunEnd, bool) {
		if drain >= len(c.l.DrainProcs) {
			return sandbox.RunEnd{}, false
		}
		return c.l.DrainProcs[drain].RunEnds.Get(k)
	}
	runBreaks, runExcused := judgeRuns(wakes, ends, excused, time.Now())
	promised := 0
	for _, w := range wakes {
		if w.Promised() {
			promised++
		}
	}
	rep.add("every promise covered by the run it named", len(runBreaks) == 0,
		fmt.Sprintf("%d promised wake-ups; %d not covered by the drainer run their answer named; %d (%.1f%%) whose run was cut by its process's kill, freeze or stop before its last line (their commits judged by the proof above)%s",
			promised, len(runBreaks), runExcused, 100*float64(runExcused)/float64(max(promised, 1)), describeRunBreak(runBreaks)))
	rep.add("the wake-up path delivered", len(path.SweptPromised) == 0 && path.ByWakeUps > 0,
		fmt.Sprintf("published first by the wake-ups' drains %d, by operations %d, by the sweep %d; promised commits: %d the sweep published first after every drain that could carry them had ended (%d while one was in flight); %d published later than %v after their commit, a figure (max %.1fs, p99 %.1fs)%s",
			path.ByWakeUps, path.ByOperations, path.BySweep, len(path.SweptPromised), path.SweptRacing, len(path.Late), deliveryLagBound,
			rep.Path.LagMaxSecs, rep.Path.LagP99Secs, describePathBreak(path.SweptPromised, nil, wakes, first, c.started)))
}
