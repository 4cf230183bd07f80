package main

// This file is long because it is one thing: the local mode's workload and
// its checks of what landed (the summary's counts and the views against the
// source tables), which read best together.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/localwarehouse"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// runWorkload writes the workload, with a replay, an outage and a dead
// letter along the way, waits for full verification and checks the views.
func (l *local) runWorkload(ctx context.Context) (*summary, error) {
	sum := &summary{Changes: map[string]int{}}
	runCtx, stopBackground := context.WithCancel(ctx)
	var background sync.WaitGroup
	defer func() {
		stopBackground()
		background.Wait()
	}()

	// The dead-letter event: one customer's creation, which the warehouse
	// refuses (it carries deadLetterMarker) until the dead-letter topic
	// holds it.
	var deadDone atomic.Bool
	l.feeder = &localwarehouse.Feeder{Client: l.client, Subscription: localSubscription, Warehouse: l.wh, Logger: l.log,
		Refuse:          func(data []byte) bool { return !deadDone.Load() && bytes.Contains(data, []byte(deadLetterMarker)) },
		DeadLetterTopic: localDeadTopic, MaxDeliveries: localMaxDeliveries}
	background.Go(func() { _ = l.feeder.Run(runCtx) })
	background.Go(func() { l.watchDeadLetters(runCtx, &deadDone) })

	var verifyMu sync.Mutex
	verifyNow := func() {
		res := l.callVerify(runCtx)
		verifyMu.Lock()
		defer verifyMu.Unlock()
		for _, r := range res {
			sum.Retried += r.Retried
			sum.Requeued += r.Requeued
		}
	}
	background.Go(func() {
		t := time.NewTicker(l.cfg.verifyEvery)
		defer t.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
				verifyNow()
			}
		}
	})

	token, err := l.issuer.Token(localSubject, localAudience, time.Hour)
	if err != nil {
		return nil, err
	}
	commits := &l.commits
	l.progress.enter("workload", fmt.Sprintf("%d commits by %d writers, with a replay, a Pub/Sub outage and a dead letter on the way", l.cfg.records, l.cfg.writers))
	var outage, replayOnce, deadOnce sync.Once
	var changesMu sync.Mutex
	var replayed atomic.Int64
	var outageRefusals atomic.Int64
	var outageActive atomic.Bool
	started := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, l.cfg.writers)
	per := l.cfg.records / l.cfg.writers
	for w := range l.cfg.writers {
		n := per
		if w == 0 {
			n += l.cfg.records % l.cfg.writers
		}
		wg.Go(func() {
			wk := &localWriter{l: l, rng: rand.New(rand.NewPCG(uint64(w)+1, 42))}
			for i := range n {
				if ctx.Err() != nil {
					return
				}
				done := commits.Add(1)
				total := int64(l.cfg.records)
				switch {
				case done == total/3:
					outage.Do(func() {
						outageActive.Store(true)
						l.faults.on.Store(true)
						// At least 300 ms, and until a publish was refused: on a
						// busy machine 300 ms may pass before a drain publishes.
						refused := l.faults.refused.Load()
						var end func()
						end = func() {
							if l.faults.refused.Load() == refused && ctx.Err() == nil {
								time.AfterFunc(50*time.Millisecond, end)
								return
							}
							l.faults.on.Store(false)
							outageActive.Store(false)
						}
						time.AfterFunc(300*time.Millisecond, end)
					})
				case done == total/2:
					replayOnce.Do(func() {
						background.Go(func() {
							n, err := l.replay(runCtx)
							if err != nil {
								l.log.Error("local replay failed", slog.Any("error", err))
							}
							replayed.Store(int64(n))
						})
					})
				}
				kind := ""
				var err error
				if w == 0 && i == n*3/4 {
					deadOnce.Do(func() {
						var id string
						kind, id, err = wk.createDeadLetterTarget(ctx)
						sum.DeadLetterEvent = id
					})
				} else {
					kind, err = wk.step(ctx)
				}
				if err != nil {
					errs <- fmt.Errorf("workload: %w", err)
					return
				}
				changesMu.Lock()
				sum.Changes[kind]++
				changesMu.Unlock()
				during := outageActive.Load()
				if code := l.wake(ctx, token); code == http.StatusServiceUnavailable && (during || outageActive.Load()) {
					outageRefusals.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	lastCommit := time.Now()
	sum.Commits = int(commits.Load())
	sum.WorkloadSeconds = lastCommit.Sub(started).Seconds()

	// Wait for every event to be verified, the dead-lettered one included.
	deadline := time.Now().Add(l.cfg.verifyTimeout)
	for {
		status, err := l.svc.Status(ctx, localWorkspace, "", 0)
		if err != nil {
			return nil, err
		}
		sum.EventsWritten, sum.Verified, sum.Pending = status.Total, status.Verified, status.Pending
		if status.Verified == status.Total && status.Pending == 0 && deadDone.Load() {
			sum.FullyVerified = true
			break
		}
		l.progress.enterOrExplain("waiting for verification", waitingReason(status, deadDone.Load()))
		if time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	sum.VerifiedAfterSecs = time.Since(lastCommit).Seconds()
	sum.DeadLetterVerified = deadDone.Load() && sum.FullyVerified
	sum.DeadLettered = l.deadCount.Load()
	sum.Replayed = int(replayed.Load())
	sum.OutageRefusals = outageRefusals.Load()
	for _, m := range l.pubsub.Messages() {
		if m.Topic == localTopic {
			sum.Published++
		}
	}
	rows, distinct, err := l.wh.Counts(ctx)
	if err != nil {
		return nil, err
	}
	sum.Landed, sum.DuplicatesAbsorbed = rows, rows-distinct
	l.progress.enter("checking the views against the source tables", "")
	if sum.Views, err = l.checkViews(ctx); err != nil {
		return sum, err
	}
	l.progress.enter("auditing the warehouse against the source", "")
	rep, err := l.svc.Audit(ctx, localWorkspace, delivery.AuditOptions{})
	sum.Audit = &rep
	return sum, err
}

// callVerify runs the Verify function once, as Cloud Scheduler does.
func (l *local) callVerify(ctx context.Context) []delivery.VerifyResult {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, l.urls.verify, strings.NewReader(`{}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var body struct {
		Workspaces []delivery.VerifyResult `json:"workspaces"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return body.Workspaces
}

// replay replays the active generation in the middle of the workload, as
// `job replay` does: page by page, draining as it goes beside the
// wake-ups and the verifier's sweeps.
func (l *local) replay(ctx context.Context) (int, error) {
	res, err := l.svc.Replay(ctx, localWorkspace, delivery.PagesOptions{Progress: delivery.NoProgress{}})
	return int(res.Rows), err
}

// deadLetterMarker marks the customer whose creation event the local
// warehouse refuses until it is dead-lettered.
const deadLetterMarker = "dead-letter@example.com"

// watchDeadLetters counts the dead-letter subscription's messages, leaving
// them there; stops the warehouse refusing the chosen event once it is
// dead-lettered, and then fast-forwards that event's acceptance by 16 minutes, so that the
// verifier's 15-minute retry sends it back to pending within the demo.
func (l *local) watchDeadLetters(ctx context.Context, done *atomic.Bool) {
	aged := false
	seen := map[string]bool{} // the emulator may hand a dead letter out again
	for ctx.Err() == nil {
		// Detached from ctx, with a bound of its own: a pull cut off by the
		// watcher's stop may already have leased its messages on the
		// server, where they would stay hidden from `job dead-letter` and
		// `job status` for the ack deadline.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		resp, err := l.client.SubscriptionAdminClient.Pull(pctx, &pubsubpb.PullRequest{Subscription: localDeadSub, MaxMessages: 100, ReturnImmediately: true})
		cancel()
		if err == nil && len(resp.ReceivedMessages) > 0 {
			var ack []string
			for _, m := range resp.ReceivedMessages {
				ack = append(ack, m.AckId)
				if seen[m.Message.MessageId] {
					continue
				}
				seen[m.Message.MessageId] = true
				l.deadCount.Add(1)
				l.log.Info("message dead-lettered", slog.String("message_id", m.Message.MessageId), slog.Int("bytes", len(m.Message.Data)))
				if bytes.Contains(m.Message.Data, []byte(deadLetterMarker)) {
					done.Store(true)
				}
			}
			// Handed back, not acknowledged: the dead letters stay for `job
			// dead-letter` in the --keep sandbox.
			// Detached: the last pull of a stopping watcher must still hand
			// its messages back, or they stay leased for the ack deadline.
			_ = l.client.SubscriptionAdminClient.ModifyAckDeadline(context.WithoutCancel(ctx), &pubsubpb.ModifyAckDeadlineRequest{Subscription: localDeadSub, AckIds: ack, AckDeadlineSeconds: 0})
		}
		if history := l.deadHistory.Load(); done.Load() && !aged && history != nil {
			l.agedDeadLetter.Store(true)
			if ok, err := sdkfixture.AgeAcceptance(ctx, l.ontology, l.gen.Generation, *history, 16*time.Minute); err == nil && ok {
				aged = true
				l.log.Info("fast-forwarded the dead-lettered event's acceptance by 16 minutes so the verifier retries it now")
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// checkViews creates the local views and compares each with the source
// table it replicates: the same record ids (or edges).
func (l *local) checkViews(ctx context.Context) ([]viewCheck, error) {
	if _, err := l.svc.CreateViews(ctx, localWorkspace); err != nil {
		return nil, err
	}
	t, err := l.svc.ActiveViewsTarget(ctx, localWorkspace)
	if err != nil {
		return nil, err
	}
	specs, err := warehouse.ViewSpecs(t)
	if err != nil {
		return nil, err
	}
	var out []viewCheck
	for _, spec := range specs {
		entity, rel := spec.Name, ""
		if spec.Kind != "entity" {
			rel = strings.TrimPrefix(spec.Kind, "edge:")
			entity = strings.TrimSuffix(spec.Name, "_"+rel)
		}
		source, err := sdkfixture.Records(ctx, l.ontology, sdkfixture.Demo, entity, rel)
		if err != nil {
			return nil, err
		}
		view, err := l.wh.ViewKeys(ctx, spec)
		if err != nil {
			return nil, err
		}
		check := viewCheck{View: spec.Name, Source: len(source), Rows: len(view), Match: len(source) == len(view)}
		for k := range source {
			if !view[k] {
				check.Match = false
				break
			}
		}
		if spec.Kind == "entity" {
			columns := make([]string, len(spec.Columns))
			for i, c := range spec.Columns {
				columns[i] = c.Name
			}
			want, err := sdkfixture.RecordValues(ctx, l.ontology, sdkfixture.Demo, entity, columns)
			if err != nil {
				return nil, err
			}
			got, err := l.wh.ViewValues(ctx, spec)
			if err != nil {
				return nil, err
			}
			for id, values := range want {
				if v, ok := got[id]; ok && v != values {
					if check.Differing == 0 {
						check.Example = fmt.Sprintf("record %s: view %s, source %s", id, v, values)
					}
					check.Differing++
					check.Match = false
				}
			}
		}
		out = append(out, check)
	}
	return out, nil
}
