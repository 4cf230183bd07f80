package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// The chaos run's proofs on fabricated rows, messages and wake-ups: each
// must fail, naming the event, when its promise is broken, and hold when it
// is kept. A proof that never records a violation would pass TestChaosRun;
// it cannot pass these.

// TestRowsProofsNameTheEvent: an accepted row with no message in Pub/Sub,
// and a verified row with no row in the warehouse, are violations.
func TestRowsProofsNameTheEvent(t *testing.T) {
	t.Parallel()
	rows := []sdkfixture.DeliveryRow{
		{EventID: "published-accepted", Accepted: true},
		{EventID: "accepted-never-published", Accepted: true},
		{EventID: "verified-landed", Accepted: true, Verified: true},
		{EventID: "verified-not-landed", Accepted: true, Verified: true},
		{EventID: "pending"},
	}
	now := time.Now()
	pub := published{messages: 3, times: map[string][]time.Time{"published-accepted": {now}, "verified-landed": {now}, "verified-not-landed": {now}}}
	landed := map[string]bool{"verified-landed": true, "published-accepted": true}
	v := violations{AcceptedNotPublished: map[string]bool{}, VerifiedNotLanded: map[string]bool{}}
	judgeRows(rows, pub, landed, &v)
	require.Equal(t, map[string]bool{"accepted-never-published": true}, v.AcceptedNotPublished)
	require.Equal(t, map[string]bool{"verified-not-landed": true}, v.VerifiedNotLanded)
	require.Contains(t, example(v.AcceptedNotPublished), "accepted-never-published", "the report line names it")
}

// TestReplayProofNamesTheEventNotSentAgain: a replay's in-scope event with
// no message stored after the replay started breaks its proof; one out of
// scope does not.
func TestReplayProofNamesTheEventNotSentAgain(t *testing.T) {
	t.Parallel()
	started := time.Now()
	before, after := started.Add(-time.Second), started.Add(time.Second)
	rows := []sdkfixture.DeliveryRow{{EventID: "sent-again"}, {EventID: "not-sent-again"}, {EventID: "out-of-scope"}}
	pub := published{times: map[string][]time.Time{"sent-again": {before, after}, "not-sent-again": {before}, "out-of-scope": {before}}}
	for _, scope := range []map[string]bool{nil, {"sent-again": true, "not-sent-again": true}} {
		c := &chaosRun{report: &chaosReport{}, replays: []replayRecord{{kind: opPartialReplay, scope: scope, started: started}}}
		if scope == nil { // the whole replay: every event is in scope
			pub.times["out-of-scope"] = append(pub.times["out-of-scope"], after)
		}
		c.proveReplays(rows, pub)
		require.Len(t, c.report.Proofs, 1)
		p := c.report.Proofs[0]
		require.False(t, p.OK, "%+v", p)
		require.Contains(t, p.Detail, "1 of")
		require.Contains(t, p.Detail, "not-sent-again")
	}
	c := &chaosRun{report: &chaosReport{}, replays: []replayRecord{{kind: opReplay, started: started}}}
	pub.times["not-sent-again"] = append(pub.times["not-sent-again"], after)
	c.proveReplays(rows, pub)
	require.True(t, c.report.Proofs[0].OK, "kept: %+v", c.report.Proofs[0])
}

// TestPromiseProofNamesTheStrandedCommit: at a moment no drain can be
// carrying it, a promised wake-up's event that is pending, unheld and was
// never published is stranded (named); a published one resolves its
// wake-up; a held one is looked at again. Only the promising process
// killed, frozen or stopped with work left after its answer excuses it
// (SPEC §3): no other instance's fault, no fault before the answer.
func TestPromiseProofNamesTheStrandedCommit(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	wake := func(id string) *sandbox.WakeRecord {
		return &sandbox.WakeRecord{HistoryIDs: []string{"h-" + id}, EventIDs: []string{id}, Code: 200, Answered: t0, Drain: 1}
	}
	published := func(id string) bool { return id == "delivered" }
	stranded := map[string]bool{"h-stranded": true}
	open := []*sandbox.WakeRecord{wake("delivered"), wake("stranded"), wake("held")}
	v := judgeQuiescent(t0.Add(time.Second), open, stranded, published, nil)
	require.Len(t, v.Stranded, 1)
	require.Equal(t, "stranded", v.Stranded[0].EventID)
	require.Contains(t, describeStranded(v.Stranded), "stranded")
	require.Equal(t, []*sandbox.WakeRecord{open[0]}, v.Resolved, "the delivered one is resolved; the held one is looked at again")
	require.Equal(t, []*sandbox.WakeRecord{open[1]}, v.Broken)

	at := func(d time.Duration) time.Time { return t0.Add(d) }
	cases := []struct {
		name    string
		fault   window
		excused bool
	}{
		{"its process killed after the answer", window{Kind: faultDrainKill, Drain: 1, From: at(500 * time.Millisecond)}, true},
		{"its process frozen after the answer", window{Kind: faultDrainFreeze, Drain: 1, From: at(500 * time.Millisecond)}, true},
		{"its process stopped with work left", window{Kind: faultDrainRestart, Drain: 1, From: at(500 * time.Millisecond)}, true},
		{"its process killed before the answer", window{Kind: faultDrainKill, Drain: 1, From: at(-time.Second)}, false},
		{"its process killed after the check", window{Kind: faultDrainKill, Drain: 1, From: at(2 * time.Second)}, false},
		{"another instance frozen after the answer", window{Kind: faultDrainFreeze, Drain: 0, From: at(500 * time.Millisecond)}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := judgeQuiescent(t0.Add(time.Second), []*sandbox.WakeRecord{wake("stranded")}, stranded, published, excusals{c.fault})
			if c.excused {
				require.Empty(t, v.Stranded)
				require.Equal(t, 1, v.Excused)
				return
			}
			require.Len(t, v.Stranded, 1)
			require.Zero(t, v.Excused)
		})
	}
}

// TestTheLivePromiseCheckCountsEachPromiseOnce: across quiescent moments,
// a delivered wake-up counts as promised once, a stranded one as broken
// once (neither is looked at again), a held one stays open until a later
// moment finds it delivered, and a wake-up answered after the moment or
// not answered 2xx is not judged.
func TestTheLivePromiseCheckCountsEachPromiseOnce(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	c := &chaosRun{}
	c.promise.c = c
	wake := func(id string, code int, answered time.Time) *sandbox.WakeRecord {
		return &sandbox.WakeRecord{HistoryIDs: []string{"h-" + id}, EventIDs: []string{id}, Code: code, Answered: answered}
	}
	c.wakes.All = []*sandbox.WakeRecord{wake("delivered", 200, t0), wake("stranded", 202, t0), wake("held", 200, t0),
		wake("refused", 503, t0), wake("later", 200, t0.Add(time.Hour))}
	delivered := map[string]bool{"delivered": true}
	published := func(id string) bool { return delivered[id] }
	stranded := map[string]bool{"h-stranded": true}
	moment := func(at time.Time) []string {
		open := c.wakes.Open(at)
		c.promise.judge(at, open, stranded, published, nil)
		var ids []string
		for _, w := range c.wakes.Open(at) {
			ids = append(ids, w.EventIDs[0])
		}
		return ids
	}
	p := &c.promise
	require.Equal(t, []string{"held"}, moment(t0.Add(time.Second)), "only the held one is looked at again")
	require.Equal(t, 1, p.promised)
	require.Len(t, p.stranded, 1)
	require.Equal(t, []string{"held"}, moment(t0.Add(2*time.Second)), "held still")
	require.Equal(t, 1, p.promised)
	require.Len(t, p.stranded, 1, "a broken promise is counted once")
	delivered["held"] = true
	require.Empty(t, moment(t0.Add(3*time.Second)))
	require.Equal(t, 2, p.promised, "the held one, delivered at last")
	require.Len(t, p.stranded, 1)
	require.Equal(t, 3, p.judged())
	require.Equal(t, []string{"later"}, func() []string {
		var ids []string
		for _, w := range c.wakes.Open(t0.Add(2 * time.Hour)) {
			ids = append(ids, w.EventIDs[0])
		}
		return ids
	}(), "a wake-up is judged once answered, a 503 never")
}

// TestPathProofNamesWhatOnlyTheSweepPublished: a promised commit that the
// verifier's sweep published first once every request to its instance open
// at its answer had ended, or that a drain published past the bound,
// breaks the wake-up path's proof; one the sweep took while such a request
// was still in flight raced the drain carrying it; an unpromised one (its
// wake-up answered 503) may go with the sweep.
func TestPathProofNamesWhatOnlyTheSweepPublished(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	ended := t0.Add(200 * time.Millisecond)
	wakes := []sandbox.WakeRecord{
		{EventIDs: []string{"by-drain"}, Committed: t0, Code: 200, Sent: t0, Answered: t0, Ended: ended},
		{EventIDs: []string{"by-sweep"}, Committed: t0, Code: 200, Sent: t0, Answered: t0, Ended: ended},
		// Late from its commit (35 s), not from its answer (20 s).
		{EventIDs: []string{"late"}, Committed: t0.Add(-15 * time.Second), Code: 200, Sent: t0, Answered: t0, Ended: ended},
		{EventIDs: []string{"at-the-bound"}, Committed: t0, Code: 200, Sent: t0, Answered: t0, Ended: ended},
		// Its process killed after the answer: neither late nor a lag.
		{EventIDs: []string{"excused"}, Drain: 2, Committed: t0, Code: 200, Sent: t0, Answered: t0, Ended: ended},
		{EventIDs: []string{"unpromised"}, Committed: t0, Code: 503, Sent: t0, Answered: t0, Ended: ended},
		{EventIDs: []string{"by-replay"}, Committed: t0, Code: 200, Sent: t0, Answered: t0, Ended: ended},
		// Coalesced on instance 2 into a drain whose request (the next
		// record's) was still in flight when the sweep took it.
		{EventIDs: []string{"swept-racing"}, Drain: 1, Committed: t0, Code: 200, Sent: t0, Answered: t0, Ended: t0},
		{Drain: 1, Committed: t0.Add(-time.Second), Code: 0, Sent: t0.Add(-time.Second), Ended: t0.Add(55 * time.Second)},
		// A request sent after the answer carries nothing of it.
		{Drain: 0, Committed: t0.Add(time.Second), Code: 0, Sent: t0.Add(time.Second), Ended: t0.Add(55 * time.Second)},
	}
	first := map[string]sandbox.FirstPublish{
		"by-drain":     {At: t0.Add(100 * time.Millisecond), Component: sandbox.ComponentDrain},
		"by-sweep":     {At: t0.Add(50 * time.Second), Component: sandbox.ComponentVerify},
		"late":         {At: t0.Add(20 * time.Second), Component: sandbox.ComponentDrain},
		"at-the-bound": {At: t0.Add(30 * time.Second), Component: sandbox.ComponentDrain},
		"excused":      {At: t0.Add(45 * time.Second), Component: sandbox.ComponentDrain},
		"unpromised":   {At: t0.Add(50 * time.Second), Component: sandbox.ComponentVerify},
		"by-replay":    {At: t0.Add(time.Second), Component: sandbox.ComponentJob},
		"swept-racing": {At: t0.Add(20 * time.Second), Component: sandbox.ComponentVerify},
	}
	killed := excusals{{Kind: faultDrainKill, Drain: 2, From: t0.Add(time.Second)}}
	r := judgePath(wakes, first, killed, 30*time.Second)
	require.Equal(t, []string{"by-sweep"}, r.SweptPromised)
	require.Equal(t, 1, r.SweptRacing, "swept while a request open at its answer was in flight")
	require.ElementsMatch(t, []string{"by-sweep", "late"}, r.Late, "later than the bound after the commit; at the bound is not late")
	require.Len(t, r.Lags, 6, "every promised commit's lag but the excused one's")
	require.Equal(t, 50*time.Second, sandbox.Quantile(r.Lags, 1))
	require.Equal(t, 4, r.ByWakeUps)
	require.Equal(t, 3, r.BySweep)
	require.Equal(t, 1, r.ByOperations)
	require.Contains(t, describePathBreak(r.SweptPromised, r.Late, wakes, first, t0),
		"event by-sweep: committed at 0.0s, answered 200 by drain 1 at 0.0s, published first by replication-verify at 50.0s; the drain's requests open at the answer ended by 0.2s")

	c := &chaosRun{report: &chaosReport{}, l: &sandbox.Local{Published: sandbox.NewPublishLedger()}}
	for id, f := range first {
		c.l.Published.First[id] = f
	}
	for _, w := range wakes {
		c.wakes.All = append(c.wakes.All, &w)
	}
	c.provePromise(killed)
	require.Equal(t, 50.0, c.report.Path.LagMaxSecs)
	var path proof
	for _, p := range c.report.Proofs {
		if strings.HasPrefix(p.Name, "the wake-up path") {
			path = p
		}
	}
	require.False(t, path.OK, "%+v", path)
	require.Contains(t, path.Detail, "by-sweep")
	require.Contains(t, path.Detail, "2 published later than 30s after their commit, a figure (max 50.0s")
}

// TestRunProofHoldsEachPromiseToItsRun: a promise is kept by the run its
// answer named if that run's last claim came after it; a run that ended
// short of it, never ended, an answer naming no run, or one naming a place
// another answer named breaks it, unless its process was killed, frozen or
// stopped with work left after the answer.
func TestRunProofHoldsEachPromiseToItsRun(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	wake := func(run, n uint64) sandbox.WakeRecord {
		return sandbox.WakeRecord{EventIDs: []string{"e"}, Drain: 1, Start: 1, Run: run, Wake: n, Code: 200, Answered: t0}
	}
	ends := map[sandbox.RunKey]sandbox.RunEnd{{Start: 1, Run: 7}: {At: t0.Add(time.Second), Covered: 12}}
	find := func(_ int, k sandbox.RunKey) (sandbox.RunEnd, bool) { e, ok := ends[k]; return e, ok }
	killed := excusals{{Kind: faultDrainKill, Drain: 1, From: t0.Add(500 * time.Millisecond)}}
	cases := []struct {
		name    string
		w       sandbox.WakeRecord
		excused excusals
		broken  bool
	}{
		{"covered by its run", wake(7, 12), nil, false},
		{"its run ended short of it", wake(7, 13), nil, true},
		{"its run never ended", wake(8, 13), nil, true},
		{"no run named", wake(0, 0), nil, true},
		{"its run never ended, its process killed after the answer", wake(8, 13), killed, false},
		{"an answer that was not a promise", sandbox.WakeRecord{Drain: 1, Code: 503, Answered: t0}, nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			broken, _ := judgeRuns([]sandbox.WakeRecord{c.w}, find, c.excused, t0.Add(2*time.Second))
			require.Equal(t, c.broken, len(broken) == 1, "%+v", broken)
			if c.broken {
				require.NotEmpty(t, describeRunBreak(broken))
			}
		})
	}

	// Two answers of one process naming one run and place: the product
	// counts each wake-up once, so one of them was never counted, even if
	// the run covered the place. Across a restart the process that
	// answered is not known: no break.
	other := wake(7, 11)
	other.EventIDs = []string{"f"}
	restarted := other
	restarted.Restarted = true
	twice := []struct {
		name   string
		wakes  []sandbox.WakeRecord
		broken int
	}{
		{"two places", []sandbox.WakeRecord{wake(7, 12), other}, 0},
		{"one place answered twice", []sandbox.WakeRecord{wake(7, 11), other}, 1},
		{"one place, the second across a restart", []sandbox.WakeRecord{wake(7, 11), restarted}, 0},
	}
	for _, c := range twice {
		t.Run(c.name, func(t *testing.T) {
			broken, _ := judgeRuns(c.wakes, find, nil, t0.Add(2*time.Second))
			require.Len(t, broken, c.broken, "%+v", broken)
			if c.broken > 0 {
				require.True(t, broken[0].Twice)
				require.Equal(t, []string{"f"}, broken[0].EventIDs, "the second answer is the one never counted")
				require.Contains(t, describeRunBreak(broken), "two answers named it")
			}
		})
	}
}
