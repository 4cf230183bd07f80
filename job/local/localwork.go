package main

// This file is long because it is one thing: the local mode's workload and
// its checks of what landed (the summary's counts and the views against the
// source tables), which read best together.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/localwarehouse"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// summary is what a local run did and found.
type summary struct {
	Commits            int            `json:"commits"`
	Changes            map[string]int `json:"changes"`
	EventsWritten      int64          `json:"events_written"`
	Published          int            `json:"published"`
	Landed             int64          `json:"landed"`
	DuplicatesAbsorbed int64          `json:"duplicates_absorbed"`
	Verified           int64          `json:"verified"`
	Pending            int64          `json:"pending"`
	Retried            int            `json:"retried"`
	Requeued           int            `json:"requeued"`
	Replayed           int            `json:"replayed"`
	OutageRefusals     int64          `json:"outage_refusals"`
	DeadLettered       int64          `json:"dead_lettered"`
	DeadLetterEvent    string         `json:"dead_letter_event"`
	DeadLetterVerified bool           `json:"dead_letter_verified"`
	FullyVerified      bool           `json:"fully_verified"`
	WorkloadSeconds    float64        `json:"workload_seconds"`
	VerifiedAfterSecs  float64        `json:"verified_after_last_commit_seconds"`
	Views              []viewCheck    `json:"views"`
	// Audit is `job audit`'s audit of the local warehouse at the end.
	Audit *delivery.AuditReport `json:"audit"`
	// The largest lags seen during the run: how long the oldest event
	// waited to be published, and to be verified once accepted.
	MaxDeliveryLagSecs     float64 `json:"max_delivery_lag_seconds"`
	MaxVerificationLagSecs float64 `json:"max_verification_lag_seconds"`
}

// viewCheck compares one view with the source table it replicates: its
// records, and every column of each.
type viewCheck struct {
	View   string `json:"view"`
	Source int    `json:"source_rows"`
	Rows   int    `json:"view_rows"`
	// Differing counts the records whose columns differ from the source
	// row's (the first one is named in Example).
	Differing int    `json:"differing_rows"`
	Example   string `json:"example,omitempty"`
	Match     bool   `json:"match"`
}

func (s *summary) failure() error {
	var problems []string
	if !s.FullyVerified {
		problems = append(problems, fmt.Sprintf("%d of %d events verified", s.Verified, s.EventsWritten))
	}
	if !s.DeadLetterVerified {
		problems = append(problems, "the dead-lettered event was not retried and verified")
	}
	for _, v := range s.Views {
		if !v.Match {
			problems = append(problems, fmt.Sprintf("view %s has %d rows where the source has %d, %d with other values (%s)", v.View, v.Rows, v.Source,
				v.Differing, v.Example))
		}
	}
	if s.Audit == nil || !s.Audit.Equal {
		problems = append(problems, "the audit found the warehouse different from the source")
	}
	if len(problems) > 0 {
		return errors.New("local: " + strings.Join(problems, "; "))
	}
	return nil
}

func (s *summary) print(w io.Writer, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	changes := []string{}
	for _, k := range []string{"create", "update", "delete", "link", "unlink"} {
		changes = append(changes, fmt.Sprintf("%d %ss", s.Changes[k], k))
	}
	fmt.Fprintf(tw, "written\t%d commits: %s\n", s.Commits, strings.Join(changes, ", "))
	fmt.Fprintf(tw, "events\t%d captured (history and baseline), in %.1fs of workload\n", s.EventsWritten, s.WorkloadSeconds)
	fmt.Fprintf(tw, "published\t%d messages (replays, retries and duplicates included)\n", s.Published)
	fmt.Fprintf(tw, "landed\t%d rows in the local warehouse; %d duplicates absorbed by the views\n", s.Landed, s.DuplicatesAbsorbed)
	fmt.Fprintf(tw, "verified\t%d of %d\n", s.Verified, s.EventsWritten)
	fmt.Fprintf(tw, "replay\t%d events sent back to pending mid-run and published again\n", s.Replayed)
	fmt.Fprintf(tw, "outage\t%d wake-ups answered 503 during the injected Pub/Sub outage\n", s.OutageRefusals)
	fmt.Fprintf(tw, "dead letter\t%d message dead-lettered (event %.12s…), retried: %s\n", s.DeadLettered, s.DeadLetterEvent, yes(s.DeadLetterVerified))
	fmt.Fprintf(tw, "retried\t%d absent events looked for again, %d sent back to pending\n", s.Retried, s.Requeued)
	fmt.Fprintf(tw, "time to full verification\t%.1fs after the last commit\n", s.VerifiedAfterSecs)
	for _, v := range s.Views {
		mark := "ok"
		if !v.Match {
			mark = "MISMATCH"
		}
		fmt.Fprintf(tw, "view %s\t%d rows, source table %d, every column compared: %s\n", v.View, v.Rows, v.Source, mark)
	}
	if a := s.Audit; a != nil {
		verdict := "equal"
		if !a.Equal {
			verdict = fmt.Sprintf("DIFFERS (%d differences)", a.Differences)
		}
		fmt.Fprintf(tw, "audit\t%s as of revision %d: %d views, %d buckets compared (`job audit`)\n", verdict, a.Watermark, len(a.Views), a.Buckets)
	}
	fmt.Fprintf(tw, "delivery lag\t%.1fs at most (the oldest pending event's wait, sampled every 250 ms)\n", s.MaxDeliveryLagSecs)
	fmt.Fprintf(tw, "verification lag\t%.1fs at most (the oldest accepted event's wait to be found in the warehouse)\n", s.MaxVerificationLagSecs)
	return tw.Flush()
}

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
	_, target, err := l.st.ActiveTarget(ctx)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(l.cfg.verifyTimeout)
	for {
		status, err := l.st.Status(ctx, target)
		if err != nil {
			return nil, err
		}
		sum.EventsWritten, sum.Verified, sum.Pending = status.Total, status.Verified, status.Pending
		if status.Verified == status.Total && status.Pending == 0 && deadDone.Load() {
			sum.FullyVerified = true
			break
		}
		if f, err := l.st.Figures(ctx, target); err == nil {
			l.progress.enterOrExplain("waiting for verification", waitingReason(f, deadDone.Load()))
		}
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
	if sum.Views, err = l.checkViews(ctx, target); err != nil {
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
// `job replay` does; the wake-ups and the verifier's sweeps publish what
// it sends back to pending.
func (l *local) replay(ctx context.Context) (int, error) {
	_, t, err := l.st.ActiveTarget(ctx)
	if err != nil {
		return 0, err
	}
	if err := l.st.InitReplay(ctx, t); err != nil {
		return 0, err
	}
	rows := 0
	for {
		page, err := l.st.AdvanceReplay(ctx, t)
		if err != nil {
			return rows, err
		}
		rows += page.Rows
		if page.Complete {
			return rows, nil
		}
	}
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
func (l *local) checkViews(ctx context.Context, t store.Target) ([]viewCheck, error) {
	if _, err := l.wh.CreateViews(ctx, t); err != nil {
		return nil, err
	}
	specs, err := warehouse.ViewSpecs(delivery.ViewsTarget(t))
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

// localWriter is one workload writer: it owns its records, so writers never
// touch each other's.
type localWriter struct {
	l         *local
	rng       *rand.Rand
	customers []string
	products  []string
	orders    []string
	edges     [][2]string
}

func (w *localWriter) pick(ids []string) string { return ids[w.rng.IntN(len(ids))] }

func remove(ids []string, id string) []string {
	if i := slices.Index(ids, id); i >= 0 {
		return slices.Delete(ids, i, i+1)
	}
	return ids
}

// step commits one random change and returns its kind.
func (w *localWriter) step(ctx context.Context) (string, error) {
	ww := w.l.writer
	roll := w.rng.IntN(100)
	switch {
	case roll < 15 && len(w.orders) > 0 && len(w.products) > 0:
		o, p := w.pick(w.orders), w.pick(w.products)
		for _, e := range w.edges {
			if e == [2]string{o, p} {
				return w.create(ctx)
			}
		}
		w.edges = append(w.edges, [2]string{o, p})
		return "link", ww.Link(ctx, "order", "products", o, p)
	case roll < 22 && len(w.edges) > 0:
		i := w.rng.IntN(len(w.edges))
		e := w.edges[i]
		w.edges = slices.Delete(w.edges, i, i+1)
		return "unlink", ww.Unlink(ctx, "order", "products", e[0], e[1])
	case roll < 47 && len(w.products)+len(w.customers)+len(w.orders) > 3:
		switch w.rng.IntN(3) {
		case 0:
			if len(w.customers) > 0 {
				return "update", ww.Update(ctx, "customer", w.pick(w.customers), map[string]any{"score": w.rng.Float64() * 100, "active": w.rng.IntN(2) == 0, "age": w.rng.IntN(90)})
			}
		case 1:
			if len(w.products) > 0 {
				return "update", ww.Update(ctx, "product", w.pick(w.products), map[string]any{"price": float64(w.rng.IntN(10000)) / 100, "stock": w.rng.IntN(500)})
			}
		default:
			if len(w.orders) > 0 {
				return "update", ww.Update(ctx, "order", w.pick(w.orders), map[string]any{"paid": true, "placed_at": time.Now().UTC()})
			}
		}
		return w.create(ctx)
	case roll < 57 && len(w.products) > 2:
		p := w.pick(w.products)
		w.products = remove(w.products, p)
		w.edges = slices.DeleteFunc(w.edges, func(e [2]string) bool { return e[1] == p })
		return "delete", ww.Delete(ctx, "product", p)
	}
	return w.create(ctx)
}

func (w *localWriter) create(ctx context.Context) (string, error) {
	ww := w.l.writer
	switch w.rng.IntN(3) {
	case 0:
		id, err := ww.Create(ctx, "customer", map[string]any{"name": fmt.Sprintf("Customer %d", w.rng.IntN(1e6)),
			"email": fmt.Sprintf("c%d@example.com", w.rng.IntN(1e6)), "age": 18 + w.rng.IntN(60), "score": w.rng.Float64(),
			"active": true, "birthday": "1990-01-02", "signed_up_at": time.Now().UTC(), "attributes": map[string]any{"tier": w.rng.IntN(3)}})
		w.customers = append(w.customers, id)
		return "create", err
	case 1:
		id, err := ww.Create(ctx, "product", map[string]any{"title": fmt.Sprintf("Product %d", w.rng.IntN(1e6)),
			"price": float64(w.rng.IntN(10000)) / 100, "stock": w.rng.IntN(100)})
		w.products = append(w.products, id)
		return "create", err
	default:
		values := map[string]any{"reference": fmt.Sprintf("O-%d", w.rng.IntN(1e6)), "total": float64(w.rng.IntN(100000)) / 100,
			"quantity": 1 + w.rng.IntN(5), "paid": false, "details": map[string]any{"channel": "web"}}
		if len(w.customers) > 0 {
			values["customer_id"] = w.pick(w.customers)
		}
		id, err := ww.Create(ctx, "order", values)
		w.orders = append(w.orders, id)
		return "create", err
	}
}

// createDeadLetterTarget creates the customer whose event the warehouse
// will refuse until it is dead-lettered; it returns the event id.
func (w *localWriter) createDeadLetterTarget(ctx context.Context) (string, string, error) {
	// Not added to the writer's customers: later updates would carry the
	// marker too.
	id, err := w.l.writer.Create(ctx, "customer", map[string]any{"name": "Dead Letter", "email": deadLetterMarker})
	if err != nil {
		return "", "", err
	}
	history, err := sdkfixture.HistoryID(ctx, w.l.ontology, sdkfixture.Demo, "customer", id, "create")
	if err != nil {
		return "", "", err
	}
	w.l.deadHistory.Store(&history)
	return "create", event.ID(w.l.gen.SourceID, history, w.l.gen.Generation), nil
}
