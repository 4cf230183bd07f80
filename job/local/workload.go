package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/localwarehouse"
	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
)

// workload is one run of the local mode's workload: the writers, what
// runs beside them (the feeder, the verifier's schedule, the dead-letter
// watch) and the staged events (an outage, a replay, a dead letter).
type workload struct {
	l       *sandbox.Local
	records int // how many changes it commits
	sum     *summary
	// runCtx ends the background work when the workload is done.
	runCtx     context.Context
	background sync.WaitGroup
	// deadDone is set once the dead-lettered event is back and verified.
	deadDone atomic.Bool

	outage, replayOnce, deadOnce sync.Once
	mu                           sync.Mutex // guards sum while writers and verifiers run
	replayed, outageRefusals     atomic.Int64
	outageActive                 atomic.Bool
}

// runWorkload writes the workload, with a replay, an outage and a dead
// letter along the way, waits for full verification and checks the views.
func runWorkload(ctx context.Context, l *sandbox.Local, records int) (*summary, error) {
	runCtx, stopBackground := context.WithCancel(ctx)
	w := &workload{l: l, records: records, sum: &summary{Changes: map[string]int{}}, runCtx: runCtx}
	defer func() {
		stopBackground()
		w.background.Wait()
	}()
	w.startBackground()
	started := time.Now()
	if err := w.write(ctx); err != nil {
		return nil, err
	}
	lastCommit := time.Now()
	w.sum.Commits = int(l.Commits.Load())
	w.sum.WorkloadSeconds = lastCommit.Sub(started).Seconds()
	if err := w.awaitVerification(ctx); err != nil {
		return nil, err
	}
	w.sum.VerifiedAfterSecs = time.Since(lastCommit).Seconds()
	return w.sum, w.check(ctx)
}

// startBackground starts the feeder (which refuses the dead-letter event,
// one customer's creation carrying deadLetterMarker, until the dead-letter
// topic holds it), the dead-letter watch and the verifier's schedule.
func (w *workload) startBackground() {
	l := w.l
	l.Feeder = &localwarehouse.Feeder{Client: l.Client, Subscription: sandbox.LocalSubscription, Warehouse: l.Wh, Logger: l.Log,
		Refuse: func(data []byte) bool {
			return !w.deadDone.Load() && bytes.Contains(data, []byte(sandbox.DeadLetterMarker))
		},
		DeadLetterTopic: sandbox.LocalDeadTopic, MaxDeliveries: sandbox.LocalMaxDeliveries}
	w.background.Go(func() { _ = l.Feeder.Run(w.runCtx) })
	w.background.Go(func() { l.WatchDeadLetters(w.runCtx, &w.deadDone) })
	w.background.Go(func() { sandbox.Every(w.runCtx, l.Config.VerifyEvery, w.verify) })
}

// verify runs the verifier once and counts what it retried.
func (w *workload) verify() {
	res := w.l.CallVerify(w.runCtx)
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range res {
		w.sum.Retried += r.Retried
		w.sum.Requeued += r.Requeued
	}
}

// write runs the writers: each commit, then a wake-up of the drain.
func (w *workload) write(ctx context.Context) error {
	l := w.l
	token, err := l.Issuer.Token(sandbox.LocalSubject, sandbox.LocalAudience, time.Hour)
	if err != nil {
		return err
	}
	l.Progress.Enter("workload", fmt.Sprintf("%d commits by %d writers, with a replay, a Pub/Sub outage and a dead letter on the way", w.records, l.Config.Writers))
	var wg sync.WaitGroup
	errs := make(chan error, l.Config.Writers)
	per := w.records / l.Config.Writers
	for i := range l.Config.Writers {
		n := per
		if i == 0 {
			n += w.records % l.Config.Writers
		}
		wg.Go(func() {
			if err := w.writer(ctx, i, n, token); err != nil {
				errs <- fmt.Errorf("workload: %w", err)
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// writer commits n changes as writer number i; the first writer's commit at
// three quarters of its share creates the dead-letter event.
func (w *workload) writer(ctx context.Context, i, n int, token string) error {
	wk := &sandbox.LocalWriter{L: w.l, Rng: rand.New(rand.NewPCG(uint64(i)+1, 42))}
	for c := range n {
		if ctx.Err() != nil {
			return nil
		}
		w.stage(ctx, w.l.Commits.Add(1))
		kind := ""
		var err error
		if i == 0 && c == n*3/4 {
			w.deadOnce.Do(func() {
				var id string
				kind, id, err = wk.CreateDeadLetterTarget(ctx)
				w.sum.DeadLetterEvent = id
			})
		} else {
			kind, err = wk.Step(ctx)
		}
		if err != nil {
			return err
		}
		w.mu.Lock()
		w.sum.Changes[kind]++
		w.mu.Unlock()
		during := w.outageActive.Load()
		if code := w.l.Wake(ctx, w.l.Urls.Drains[0], token); code == http.StatusServiceUnavailable && (during || w.outageActive.Load()) {
			w.outageRefusals.Add(1)
		}
	}
	return nil
}

// stage starts the staged events at their commit: the Pub/Sub outage at a
// third of the workload, the replay at half.
func (w *workload) stage(ctx context.Context, done int64) {
	total := int64(w.records)
	switch done {
	case total / 3:
		w.outage.Do(func() { w.startOutage(ctx) })
	case total / 2:
		w.replayOnce.Do(func() {
			w.background.Go(func() {
				n, err := w.l.Replay(w.runCtx)
				if err != nil {
					w.l.Log.Error("local replay failed", slog.Any("error", err))
				}
				w.replayed.Store(int64(n))
			})
		})
	}
}

// startOutage makes Pub/Sub refuse publishes for at least 300 ms, and
// until a publish was refused: on a busy machine 300 ms may pass before a
// drain publishes.
func (w *workload) startOutage(ctx context.Context) {
	faults := w.l.Faults
	w.outageActive.Store(true)
	faults.On.Store(true)
	refused := faults.Refused.Load()
	var end func()
	end = func() {
		if faults.Refused.Load() == refused && ctx.Err() == nil {
			time.AfterFunc(50*time.Millisecond, end)
			return
		}
		faults.On.Store(false)
		w.outageActive.Store(false)
	}
	time.AfterFunc(300*time.Millisecond, end)
}

// awaitVerification waits, up to --timeout, for every event to be
// verified, the dead-lettered one included.
func (w *workload) awaitVerification(ctx context.Context) error {
	l, sum := w.l, w.sum
	deadline := time.Now().Add(l.Config.VerifyTimeout)
	for {
		status, err := l.Svc.Status(ctx, sandbox.LocalWorkspace, "", 0)
		if err != nil {
			return err
		}
		sum.EventsWritten, sum.Verified, sum.Pending = status.Total, status.Verified, status.Pending
		if status.Verified == status.Total && status.Pending == 0 && w.deadDone.Load() {
			sum.FullyVerified = true
			return nil
		}
		l.Progress.EnterOrExplain("waiting for verification", sandbox.WaitingReason(status, w.deadDone.Load()))
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// check fills the summary's counts, checks the views against the source
// tables and audits the warehouse.
func (w *workload) check(ctx context.Context) error {
	l, sum := w.l, w.sum
	sum.DeadLetterVerified = w.deadDone.Load() && sum.FullyVerified
	sum.DeadLettered = l.DeadCount.Load()
	sum.Replayed = int(w.replayed.Load())
	sum.OutageRefusals = w.outageRefusals.Load()
	sum.OutagePublishes = w.l.Faults.Refused.Load()
	for _, m := range l.Pubsub.Messages() {
		if m.Topic == sandbox.LocalTopic {
			sum.Published++
		}
	}
	rows, distinct, err := l.Wh.Counts(ctx)
	if err != nil {
		return err
	}
	sum.Landed, sum.DuplicatesAbsorbed = rows, rows-distinct
	l.Progress.Enter("checking the views against the source tables", "")
	if sum.Views, err = l.CheckViews(ctx); err != nil {
		return err
	}
	l.Progress.Enter("auditing the warehouse against the source", "")
	rep, err := l.Svc.Audit(ctx, sandbox.LocalWorkspace, delivery.AuditOptions{})
	sum.Audit = &rep
	return err
}
