package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/testbench/localwarehouse"
	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
)

// chaosConfig is the chaos run's flags: how long the faults run, the seed
// of their schedule and the SDK workload's rate while it is busy.
type chaosConfig struct {
	duration time.Duration
	seed     uint64
	rate     float64
	// plot is where --plot writes the run's timeline (SVG).
	plot string
}

// minChaos is the shortest chaos run: long enough for every fault kind
// and operation to happen at least once, and the verifier's passes to meet
// the BigQuery faults.
const minChaos = 45 * time.Second

// sweepEvery is the verifier's sweep's schedule during the faults:
// production's (Cloud Scheduler calls the verifier once a minute), so that
// what the sweep delivers is told from what the wake-ups' drains do.
const sweepEvery = time.Minute

// chaosRun is one chaos run: the workload, the nemesis, the operations
// and the live proofs, and what they recorded.
type chaosRun struct {
	l       *sandbox.Local
	cfg     chaosConfig
	nemesis *nemesis
	checker *liveChecker
	report  *chaosReport
	started time.Time
	token   *tokenSource
	commits atomic.Int64
	failed  atomic.Int64 // SDK commits that failed (a restart, say)
	traffic traffic
	wakes   sandbox.WakeLedger
	promise promiseChecker
	race    claimRace
	// stalled holds the BigQuery subscription's writes while above 0.
	stalled  atomic.Int64
	changes  sync.Map // kind → *atomic.Int64
	opsWG    sync.WaitGroup
	replayMu sync.Mutex
	// replays are the replays run, with when each started: the proofs
	// check that each sent its events through Pub/Sub again.
	replays []replayRecord
	// passes counts the verifier's passes, and failedPasses those that
	// failed a workspace.
	passes, failedPasses atomic.Int64
	// series is the run's figures over time (--plot).
	series chaosSeries
}

// replayRecord is one replay the run made, for the proofs.
type replayRecord struct {
	kind string
	// scope is the events it must publish again (nil: the whole
	// generation's, every event captured before it started).
	scope   map[string]bool
	started time.Time
	err     error
}

// runChaos runs the chaos mode: the SDK workload at the chosen rate for
// the duration while the nemesis injects faults and the operations run,
// then, faults off, waits for full verification and proves what was
// promised.
func runChaos(ctx context.Context, l *sandbox.Local, cfg chaosConfig) (*chaosReport, error) {
	c := &chaosRun{l: l, cfg: cfg, started: time.Now(), report: &chaosReport{Seed: cfg.seed, DurationSeconds: cfg.duration.Seconds(),
		RateCommitsPerSecond: cfg.rate, Drains: len(l.DrainProcs), Changes: map[string]int64{}}}
	c.token = &tokenSource{issuer: l.Issuer}
	c.traffic = newTraffic(c.cfg.seed)
	c.nemesis = newNemesis(c, cfg)
	c.checker = &liveChecker{l: l, found: violations{AcceptedNotPublished: map[string]bool{}, VerifiedNotLanded: map[string]bool{}}}
	c.promise = promiseChecker{c: c}
	c.race = claimRace{c: c}
	if c.cfg.plot != "" {
		l.Progress.OnSample = c.series.add
	}
	runCtx, stopBackground := context.WithCancel(ctx)
	var background sync.WaitGroup
	defer func() {
		stopBackground()
		background.Wait()
	}()
	l.Feeder = &localwarehouse.Feeder{Client: l.Client, Subscription: sandbox.LocalSubscription, Warehouse: l.Wh, Logger: l.Log,
		DeadLetterTopic: sandbox.LocalDeadTopic, MaxDeliveries: sandbox.LocalMaxDeliveries, Stalled: func() bool { return c.stalled.Load() > 0 }}
	background.Go(func() { _ = l.Feeder.Run(runCtx) })
	faultCtx, endFaults := context.WithTimeout(ctx, c.cfg.duration)
	defer endFaults()
	background.Go(func() { c.verifyLoop(runCtx, faultCtx) })
	background.Go(func() { c.checker.run(runCtx) })
	background.Go(func() { c.promise.run(faultCtx) })
	background.Go(func() { c.race.run(faultCtx) })
	l.Progress.Enter("chaos", fmt.Sprintf("%v of SDK commits at %.0f/s while busy, with faults, %d drain instances (seed %d)",
		c.cfg.duration, c.cfg.rate, len(l.DrainProcs), c.cfg.seed))
	var writers sync.WaitGroup
	for i := range l.Config.Writers {
		writers.Go(func() { c.writer(faultCtx, i) })
	}
	c.nemesis.run(faultCtx, ctx)
	writers.Wait()
	c.report.CommitsPerSecond = float64(c.commits.Load()) / time.Since(c.started).Seconds()
	l.Progress.Enter("faults off", "waiting for the operations still running")
	c.opsWG.Wait()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	faultsOff := time.Now()
	c.report.Commits, c.report.CommitsFailed = c.commits.Load(), c.failed.Load()
	c.changes.Range(func(k, v any) bool { c.report.Changes[k.(string)] = v.(*atomic.Int64).Load(); return true })
	if err := c.awaitVerification(ctx); err != nil {
		return nil, err
	}
	c.report.VerifiedAfterFaultsSecs = time.Since(faultsOff).Seconds()
	stopBackground()
	background.Wait()
	if err := c.prove(ctx); err != nil {
		return c.report, err
	}
	if c.cfg.plot != "" {
		if err := c.plotChaos(c.cfg.plot, faultsOff); err != nil {
			return c.report, fmt.Errorf("--plot: %w", err)
		}
	}
	return c.report, nil
}

// writer commits changes as writer number i at its share of the rate while
// the SDK is busy (traffic), each followed by a wake-up of one of the
// drain instances with a current token, until ctx ends. A commit that
// fails (the database restarting, a migration holding the writers past
// their patience) is an action that failed: counted, and not woken.
func (c *chaosRun) writer(ctx context.Context, i int) {
	l := c.l
	rng := rand.New(rand.NewPCG(c.cfg.seed+uint64(i)+1, 42))
	var ids []string
	wk := &sandbox.LocalWriter{L: l, Rng: rng, Ww: l.Writer.OnCommit(func(h []string) { ids = h })}
	every := time.Duration(float64(time.Second) * float64(l.Config.Writers) / c.cfg.rate)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		if !c.traffic.awaitBusy(ctx, c.started) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		ids = nil
		kind, err := c.commitOnce(ctx, wk)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.failed.Add(1)
			continue
		}
		committed := time.Now()
		c.commits.Add(1)
		l.Commits.Add(1)
		n, _ := c.changes.LoadOrStore(kind, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		token, err := c.token.get()
		if err != nil {
			continue
		}
		rec := c.wakeRecordOf(ids, committed, rng.IntN(len(l.Urls.Drains)))
		c.wakes.Send(ctx, l, l.Urls.Drains[rec.Drain], token, rec)
	}
}

// wakeRecordOf is the record of a commit of history rows ids, committed at
// committed, whose wake-up goes to instance drain.
func (c *chaosRun) wakeRecordOf(ids []string, committed time.Time, drain int) *sandbox.WakeRecord {
	rec := &sandbox.WakeRecord{HistoryIDs: ids, Committed: committed, Drain: drain}
	for _, h := range ids {
		rec.EventIDs = append(rec.EventIDs, event.ID(c.l.Gen.SourceID, h, c.l.Gen.Generation))
	}
	return rec
}

// commitOnce commits one change, bounded as an SDK action is (a writer
// waiting behind a migration gives up after 10 s).
func (c *chaosRun) commitOnce(ctx context.Context, wk *sandbox.LocalWriter) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return wk.Step(cctx)
}

// traffic is when the SDK is busy: bursts of commits at the rate, 1 to 2.5
// s long, and pauses of 1.5 to 3 s between them, drawn from the seed. At each
// pause every wake-up ends, and the promise is checked (promiseChecker).
type traffic struct{ bursts []time.Duration } // alternate ends of busy and quiet spans

func newTraffic(seed uint64) traffic {
	rng := rand.New(rand.NewPCG(seed, 0x747261666663))
	var t traffic
	at := time.Duration(0)
	for at < 24*time.Hour && len(t.bursts) < 100_000 {
		at += time.Second + time.Duration(rng.Int64N(int64(1500*time.Millisecond)))
		t.bursts = append(t.bursts, at)
		at += 1500*time.Millisecond + time.Duration(rng.Int64N(int64(1500*time.Millisecond)))
		t.bursts = append(t.bursts, at)
	}
	return t
}

// busy reports whether the SDK is busy at elapsed, and until when the
// span lasts.
func (t traffic) busy(elapsed time.Duration) (bool, time.Duration) {
	for i, end := range t.bursts {
		if elapsed < end {
			return i%2 == 0, end
		}
	}
	return true, elapsed + time.Hour
}

// awaitBusy waits until the SDK is busy (false when ctx ended first).
func (t traffic) awaitBusy(ctx context.Context, started time.Time) bool {
	busy, until := t.busy(time.Since(started))
	if busy {
		return ctx.Err() == nil
	}
	return sandbox.SleepUntil(ctx, started.Add(until))
}

// verifyLoop calls the verifier as Cloud Scheduler does: every
// --verify-every a pass that only verifies and, during the faults, a pass
// with the sweep once a minute (production's schedule); once the faults
// are off, every pass sweeps, so that what the faults left pending is
// settled. Like Cloud Scheduler it does not wait for a pass to end before
// it starts the next (a pass held by a slow BigQuery goes on beside the
// next ones), up to four at once.
func (c *chaosRun) verifyLoop(ctx, faults context.Context) {
	lastSweep := time.Now()
	var running atomic.Int64
	var passes sync.WaitGroup
	defer passes.Wait()
	sandbox.Every(ctx, c.l.Config.VerifyEvery, func() {
		if running.Load() >= 4 {
			return
		}
		url := c.l.Urls.Verify
		if faults.Err() != nil || time.Since(lastSweep) >= sweepEvery {
			url, lastSweep = c.l.Urls.Sweep, time.Now()
		}
		running.Add(1)
		passes.Go(func() {
			defer running.Add(-1)
			res := c.l.CallVerifyAt(ctx, url)
			c.passes.Add(1)
			for _, w := range res {
				if w.Outcome == "failed" {
					c.failedPasses.Add(1)
					break
				}
			}
		})
	})
}

// awaitVerification waits, up to --timeout, for every event to be
// verified with nothing pending or set aside.
func (c *chaosRun) awaitVerification(ctx context.Context) error {
	l := c.l
	deadline := time.Now().Add(l.Config.VerifyTimeout)
	for {
		status, err := l.Svc.Status(ctx, sandbox.LocalWorkspace, "", 0)
		if err != nil {
			return err
		}
		c.report.Events, c.report.Verified, c.report.Pending, c.report.SetAside = status.Total, status.Verified, status.Pending, status.SetAside.Count
		if status.Verified == status.Total && status.Pending == 0 && status.SetAside.Count == 0 {
			c.report.FullyVerified = true
			return nil
		}
		l.Progress.EnterOrExplain("faults off, waiting for verification", sandbox.WaitingReason(status, true))
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// tokenSource hands the writers a runtime token, signed again once the
// issuer's key was rotated, as the platform re-signs its tokens.
type tokenSource struct {
	issuer interface {
		Token(subject, audience string, ttl time.Duration) (string, error)
		CurrentKeyID() string
	}
	mu    sync.Mutex
	kid   string
	token string
}

func (t *tokenSource) get() (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if kid := t.issuer.CurrentKeyID(); kid != t.kid || t.token == "" {
		token, err := t.issuer.Token(sandbox.LocalSubject, sandbox.LocalAudience, time.Hour)
		if err != nil {
			return "", err
		}
		t.kid, t.token = kid, token
	}
	return t.token, nil
}
