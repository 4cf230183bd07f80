package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentstream/ontology-replication/shared/testbench/localwarehouse"
)

// chaosConfig is the chaos run's flags: how long the faults run, the seed
// of their schedule and the SDK workload's rate.
type chaosConfig struct {
	duration time.Duration
	seed     uint64
	rate     float64
}

// minChaos is the shortest chaos run: long enough for every fault kind
// and operation to happen at least once, and the verifier's passes to meet
// the BigQuery faults.
const minChaos = 45 * time.Second

// chaosRun is one chaos run: the workload, the nemesis, the operations
// and the live proofs, and what they recorded.
type chaosRun struct {
	l       *local
	nemesis *nemesis
	checker *liveChecker
	report  *chaosReport
	started time.Time
	token   *tokenSource
	commits atomic.Int64
	// wakesInFlight counts the wake-ups sent and not answered yet.
	wakesInFlight atomic.Int64
	// stalled holds the BigQuery subscription's writes while above 0.
	stalled  atomic.Int64
	changes  sync.Map // kind → *atomic.Int64
	opsWG    sync.WaitGroup
	replayMu sync.Mutex
	// replays are the replays run, with when each started: the proofs
	// check that each sent its events through Pub/Sub again.
	replays []replayRecord
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
func (l *local) runChaos(ctx context.Context) (*chaosReport, error) {
	c := &chaosRun{l: l, started: time.Now(), report: &chaosReport{Seed: l.cfg.chaos.seed, DurationSeconds: l.cfg.chaos.duration.Seconds(),
		RateCommitsPerSecond: l.cfg.chaos.rate, Changes: map[string]int64{}}}
	c.token = &tokenSource{issuer: l.issuer}
	c.nemesis = newNemesis(c, l.cfg.chaos)
	c.checker = &liveChecker{l: l, found: violations{AcceptedNotPublished: map[string]bool{}, VerifiedNotLanded: map[string]bool{}}}
	runCtx, stopBackground := context.WithCancel(ctx)
	var background sync.WaitGroup
	defer func() {
		stopBackground()
		background.Wait()
	}()
	l.feeder = &localwarehouse.Feeder{Client: l.client, Subscription: localSubscription, Warehouse: l.wh, Logger: l.log,
		DeadLetterTopic: localDeadTopic, MaxDeliveries: localMaxDeliveries, Stalled: func() bool { return c.stalled.Load() > 0 }}
	background.Go(func() { _ = l.feeder.Run(runCtx) })
	background.Go(func() { c.verifyLoop(runCtx) })
	background.Go(func() { c.checker.run(runCtx) })
	l.progress.enter("chaos", fmt.Sprintf("%v of SDK commits at %.0f/s with faults (seed %d)", l.cfg.chaos.duration, l.cfg.chaos.rate, l.cfg.chaos.seed))
	faultCtx, endFaults := context.WithTimeout(ctx, l.cfg.chaos.duration)
	defer endFaults()
	var writers sync.WaitGroup
	errs := make(chan error, l.cfg.writers)
	for i := range l.cfg.writers {
		writers.Go(func() {
			if err := c.writer(faultCtx, i); err != nil {
				errs <- err
			}
		})
	}
	c.nemesis.run(faultCtx, ctx)
	writers.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, fmt.Errorf("chaos workload: %w", err)
	}
	l.progress.enter("faults off", "waiting for the operations still running")
	c.opsWG.Wait()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	faultsOff := time.Now()
	c.report.Commits = c.commits.Load()
	c.changes.Range(func(k, v any) bool { c.report.Changes[k.(string)] = v.(*atomic.Int64).Load(); return true })
	if err := c.awaitVerification(ctx); err != nil {
		return nil, err
	}
	c.report.VerifiedAfterFaultsSecs = time.Since(faultsOff).Seconds()
	stopBackground()
	background.Wait()
	return c.report, c.prove(ctx)
}

// writer commits changes as writer number i at its share of the rate,
// each followed by a wake-up of the drain with a current token, until ctx
// ends.
func (c *chaosRun) writer(ctx context.Context, i int) error {
	l := c.l
	wk := &localWriter{l: l, rng: rand.New(rand.NewPCG(c.l.cfg.chaos.seed+uint64(i)+1, 42))}
	every := time.Duration(float64(time.Second) * float64(l.cfg.writers) / l.cfg.chaos.rate)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		kind, err := wk.step(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		c.commits.Add(1)
		l.commits.Add(1)
		n, _ := c.changes.LoadOrStore(kind, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		token, err := c.token.get()
		if err != nil {
			return err
		}
		c.wakesInFlight.Add(1)
		code := l.wake(ctx, token)
		c.wakesInFlight.Add(-1)
		c.nemesis.countWake(code)
	}
}

// verifyLoop calls the verifier every --verify-every, as Cloud Scheduler
// does, one pass at a time.
func (c *chaosRun) verifyLoop(ctx context.Context) {
	every(ctx, c.l.cfg.verifyEvery, func() { c.l.callVerify(ctx) })
}

// awaitVerification waits, up to --timeout, for every event to be
// verified with nothing pending or set aside.
func (c *chaosRun) awaitVerification(ctx context.Context) error {
	l := c.l
	deadline := time.Now().Add(l.cfg.verifyTimeout)
	for {
		status, err := l.svc.Status(ctx, localWorkspace, "", 0)
		if err != nil {
			return err
		}
		c.report.Events, c.report.Verified, c.report.Pending, c.report.SetAside = status.Total, status.Verified, status.Pending, status.SetAside.Count
		if status.Verified == status.Total && status.Pending == 0 && status.SetAside.Count == 0 {
			c.report.FullyVerified = true
			return nil
		}
		l.progress.enterOrExplain("faults off, waiting for verification", waitingReason(status, true))
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
		token, err := t.issuer.Token(localSubject, localAudience, time.Hour)
		if err != nil {
			return "", err
		}
		t.kid, t.token = kid, token
	}
	return t.token, nil
}
