package main

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/faultproxy"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// The nemesis's fault kinds. Each reaches the product only through a
// boundary production has: its database sessions, the wire to Pub/Sub and
// to BigQuery, the issuer's key set, the server's stop.
const (
	faultEndDrainSessions  = "end_drain_sessions"
	faultEndVerifySessions = "end_verifier_sessions"
	faultEndJobSessions    = "end_job_sessions"
	faultPubSubRefuse      = "pubsub_refuse"
	faultPubSubHang        = "pubsub_hang"
	faultPubSubLose        = "pubsub_lose_response"
	faultPubSubReset       = "pubsub_reset_connections"
	faultBigQuerySlow      = "bigquery_slow"
	faultBigQueryError     = "bigquery_5xx"
	faultKeyRotation       = "key_rotation"
	faultDrainRestart      = "drain_restart"
	faultWarehouseStall    = "warehouse_stall"
)

// faultKinds lists every fault kind; each schedule has all of them.
var faultKinds = []string{faultEndDrainSessions, faultEndVerifySessions, faultEndJobSessions, faultPubSubRefuse, faultPubSubHang,
	faultPubSubLose, faultPubSubReset, faultBigQuerySlow, faultBigQueryError, faultKeyRotation, faultDrainRestart, faultWarehouseStall}

// The operations the chaos run makes while the faults run, as `job` does.
const (
	opReplay        = "replay"
	opPartialReplay = "partial_replay"
	opJobDrain      = "job_drain"
)

// step is one entry of the schedule: a fault (held for For when it is a
// window) or an operation, at At from the start.
type step struct {
	At   time.Duration
	Kind string
	For  time.Duration
}

// schedule is the run's faults and operations, from the seed alone: the
// faults come in rounds, each round every kind once in a shuffled order,
// about 2 s apart, until 90 % of the duration; the whole replay at 30 %,
// the partial replay at 50 %, `job drain` at 70 %. A key rotation comes
// no sooner than rotationSpacing after the last one: the drain fetches the
// keys for an unknown key id at most once per 30 s
// (identity.Config.RefetchInterval), so a second rotation sooner has every
// wake-up refused (401) until then, which would hide the other faults from
// the wake-ups.
func schedule(seed uint64, d time.Duration) []step {
	rng := rand.New(rand.NewPCG(seed, 0x6e656d65736973))
	gap := min(2500*time.Millisecond, time.Duration(float64(d)*0.85)/time.Duration(len(faultKinds)+1))
	var steps []step
	at := gap / 2
	lastRotation, rotationDue := -rotationSpacing, false
	for at < d*9/10 {
		kinds := append([]string(nil), faultKinds...)
		rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
		for _, k := range kinds {
			if at >= d*9/10 {
				break
			}
			if k == faultKeyRotation {
				rotationDue = true
				continue
			}
			if rotationDue && at-lastRotation >= rotationSpacing {
				steps = append(steps, step{At: at, Kind: faultKeyRotation})
				lastRotation, rotationDue = at, false
				at += gap*3/4 + time.Duration(rng.Int64N(int64(gap/2)))
			}
			s := step{At: at, Kind: k}
			switch k {
			case faultPubSubRefuse, faultPubSubHang, faultPubSubLose:
				s.For = gap/4 + time.Duration(rng.Int64N(int64(gap/2)))
			case faultBigQuerySlow, faultBigQueryError, faultWarehouseStall:
				// Long enough for a verifier pass to meet it.
				s.For = 3*time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
			}
			steps = append(steps, s)
			at += gap*3/4 + time.Duration(rng.Int64N(int64(gap/2)))
		}
	}
	for _, op := range []struct {
		kind string
		at   float64
	}{{opReplay, 0.3}, {opPartialReplay, 0.5}, {opJobDrain, 0.7}} {
		steps = append(steps, step{At: time.Duration(float64(d) * op.at), Kind: op.kind})
	}
	return steps
}

// rotationSpacing is the least time between key rotations.
const rotationSpacing = 35 * time.Second

// timelineEntry is one fault or operation as it happened.
type timelineEntry struct {
	AtSeconds  float64 `json:"at_seconds"`
	Kind       string  `json:"kind"`
	ForSeconds float64 `json:"for_seconds,omitempty"`
	Detail     string  `json:"detail,omitempty"`
	Failed     bool    `json:"failed,omitempty"`
}

// nemesis injects the schedule's faults and starts its operations,
// printing each as it goes.
type nemesis struct {
	c     *chaosRun
	steps []step

	mu       sync.Mutex
	timeline []timelineEntry
	wakes    map[string]int
	rotation int
}

func newNemesis(c *chaosRun, cfg chaosConfig) *nemesis {
	return &nemesis{c: c, steps: schedule(cfg.seed, cfg.duration), wakes: map[string]int{}}
}

// countWake counts a wake-up's answer (0: no answer, as when the drain
// was restarting).
func (n *nemesis) countWake(code int) {
	key := "no_answer"
	if code != 0 {
		key = fmt.Sprint(code)
	}
	n.mu.Lock()
	n.wakes[key]++
	n.mu.Unlock()
}

// run injects the faults until ctx ends (the duration), in the
// schedule's order; the operations run beside them, one after another,
// each started at its time even on a machine so slow that the faults
// ended first, and stopped only by opsCtx. When it returns every fault is
// off.
func (n *nemesis) run(ctx, opsCtx context.Context) {
	start := n.c.started
	var ops []step
	for _, s := range n.steps {
		if s.Kind == opReplay || s.Kind == opPartialReplay || s.Kind == opJobDrain {
			ops = append(ops, s)
		}
	}
	n.c.opsWG.Go(func() { n.runOperations(opsCtx, ops) })
	defer n.allOff()
	for _, s := range n.steps {
		if s.Kind == opReplay || s.Kind == opPartialReplay || s.Kind == opJobDrain {
			continue
		}
		if !sleepUntil(ctx, start.Add(s.At)) {
			return
		}
		n.inject(ctx, s)
	}
	<-ctx.Done()
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// allOff ends every fault.
func (n *nemesis) allOff() {
	n.c.l.pubsubProxy.Set(faultproxy.Pass)
	n.c.l.bigqueryFaults.Set(faultproxy.HTTPPass)
}

// inject applies one fault and, for a window, holds it for its length.
func (n *nemesis) inject(ctx context.Context, s step) {
	l := n.c.l
	at := time.Since(n.c.started)
	detail, failed := "", false
	switch s.Kind {
	case faultEndDrainSessions, faultEndVerifySessions, faultEndJobSessions:
		component := map[string]string{faultEndDrainSessions: componentDrain, faultEndVerifySessions: componentVerify, faultEndJobSessions: componentJob}[s.Kind]
		ended, err := pgtest.TerminateBackends(context.WithoutCancel(ctx), l.ontology, component)
		detail, failed = fmt.Sprintf("%d sessions of %s ended", ended, component), err != nil
	case faultPubSubRefuse, faultPubSubHang, faultPubSubLose:
		f := map[string]faultproxy.Fault{faultPubSubRefuse: faultproxy.Refuse, faultPubSubHang: faultproxy.Hang, faultPubSubLose: faultproxy.LoseResponse}[s.Kind]
		before := l.pubsubProxy.Count(f)
		l.pubsubProxy.Set(f)
		sleepUntil(ctx, time.Now().Add(s.For))
		l.pubsubProxy.Set(faultproxy.Pass)
		detail = fmt.Sprintf("%d publishes met it", l.pubsubProxy.Count(f)-before)
	case faultPubSubReset:
		detail = fmt.Sprintf("%d connections reset", l.pubsubProxy.Reset())
	case faultBigQuerySlow, faultBigQueryError:
		f := map[string]faultproxy.HTTPFault{faultBigQuerySlow: faultproxy.HTTPSlow, faultBigQueryError: faultproxy.HTTPError}[s.Kind]
		before := l.bigqueryFaults.Count(f)
		l.bigqueryFaults.Set(f)
		sleepUntil(ctx, time.Now().Add(s.For))
		l.bigqueryFaults.Set(faultproxy.HTTPPass)
		detail = fmt.Sprintf("%d BigQuery requests met it", l.bigqueryFaults.Count(f)-before)
	case faultWarehouseStall:
		detail = n.stall(ctx, s.For)
	case faultKeyRotation:
		n.mu.Lock()
		n.rotation++
		kid := fmt.Sprintf("local-key-%d", n.rotation)
		n.mu.Unlock()
		err := l.issuer.Rotate(kid)
		detail, failed = "new key "+kid+" served, the old one removed, tokens signed again", err != nil
	case faultDrainRestart:
		// At a moment a wake-up is in flight (2 s at most), and in the
		// background: the stop waits for the requests in flight.
		for wait := time.Now().Add(2 * time.Second); n.c.wakesInFlight.Load() == 0 && time.Now().Before(wait); {
			time.Sleep(time.Millisecond)
		}
		inFlight := n.c.wakesInFlight.Load()
		n.c.opsWG.Go(func() {
			stopped, err := l.drainProc.restart(context.WithoutCancel(ctx))
			n.record(timelineEntry{AtSeconds: time.Since(n.c.started).Seconds(), Kind: s.Kind + "_done",
				Detail: fmt.Sprintf("the old process stopped in %.1fs; a new one serves", stopped.Seconds()), Failed: err != nil})
		})
		detail = fmt.Sprintf("SIGTERM to the drain process with %d wake-ups in flight", inFlight)
	}
	n.record(timelineEntry{AtSeconds: at.Seconds(), Kind: s.Kind, ForSeconds: s.For.Seconds(), Detail: detail, Failed: failed})
}

// stall holds the BigQuery subscription's writes for d (the events
// published meanwhile land late, and the verifier finds them absent) and
// says how many messages were published meanwhile.
func (n *nemesis) stall(ctx context.Context, d time.Duration) string {
	before := n.c.l.readPublished().messages
	n.c.stalled.Add(1)
	sleepUntil(ctx, time.Now().Add(d))
	n.c.stalled.Add(-1)
	return fmt.Sprintf("the BigQuery subscription wrote nothing while %d messages were published", n.c.l.readPublished().messages-before)
}

// replayStall is how long the BigQuery subscription is held from a
// replay's start: the replayed events are published again, acknowledged and
// wait to be verified while the warehouse lags, so that a replay that left
// its events' receipts or a verifier that verifies what did not land
// shows for seconds, not for the moment before the next pass.
const replayStall = 4 * time.Second

// runOperations runs the operations one after another at their times,
// with the job's Service, as `job replay` and `job drain` do.
func (n *nemesis) runOperations(ctx context.Context, ops []step) {
	l := n.c.l
	for _, s := range ops {
		if !sleepUntil(ctx, n.c.started.Add(s.At)) {
			return
		}
		rec := replayRecord{kind: s.Kind}
		if s.Kind == opPartialReplay {
			// Its scope: the customers' events accepted before it starts,
			// which its bound (the database's clock once it starts) selects.
			// One published before and accepted after that bound is not
			// selected, by design.
			scope, err := n.acceptedEvents(ctx, partialEntity+"_history")
			if err != nil {
				rec.err = fmt.Errorf("read the partial replay's scope: %w", err)
			}
			rec.scope = scope
		}
		started := time.Now()
		rec.started = started
		start := timelineEntry{AtSeconds: time.Since(n.c.started).Seconds(), Kind: s.Kind}
		if s.Kind != opJobDrain {
			start.Detail = fmt.Sprintf("the BigQuery subscription held for its first %v", replayStall)
		}
		n.record(start)
		var detail string
		var err error
		if s.Kind != opJobDrain {
			n.c.stalled.Add(1)
			time.AfterFunc(replayStall, func() { n.c.stalled.Add(-1) })
		}
		switch s.Kind {
		case opReplay:
			var res delivery.PagesResult
			res, err = l.svc.Replay(ctx, localWorkspace, delivery.PagesOptions{Progress: delivery.NoProgress{}})
			detail = fmt.Sprintf("%d events sent back and published again", res.Rows)
		case opPartialReplay:
			var res delivery.PagesResult
			res, err = l.svc.ReplayPartial(ctx, localWorkspace, delivery.PagesOptions{Progress: delivery.NoProgress{}},
				delivery.ReplaySelection{Entities: []string{partialEntity}})
			detail = fmt.Sprintf("%d %s events sent back and published again", res.Rows, partialEntity)
		case opJobDrain:
			var res delivery.DrainAllResult
			res, err = l.svc.DrainAll(ctx, localWorkspace, delivery.DrainAllOptions{})
			detail = fmt.Sprintf("%d events published", res.Published)
		}
		if err != nil {
			detail = err.Error()
		}
		rec.err = cmp.Or(err, rec.err)
		if s.Kind != opJobDrain {
			n.c.replayMu.Lock()
			n.c.replays = append(n.c.replays, rec)
			n.c.replayMu.Unlock()
		}
		n.c.opErrs(s.Kind, rec.err)
		n.record(timelineEntry{AtSeconds: time.Since(n.c.started).Seconds(), Kind: s.Kind + "_done", ForSeconds: time.Since(started).Seconds(),
			Detail: detail, Failed: err != nil})
	}
}

// acceptedEvents returns the event ids of a history table's accepted
// events.
func (n *nemesis) acceptedEvents(ctx context.Context, historyTable string) (map[string]bool, error) {
	rows, err := sdkfixture.DeliveryRows(ctx, n.c.l.ontology, n.c.l.gen)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, r := range rows {
		if r.Accepted && r.HistoryTable == historyTable {
			out[r.EventID] = true
		}
	}
	return out, nil
}

// partialEntity is the entity the partial replay selects.
const partialEntity = "customer"

// record adds an entry to the timeline and prints it.
func (n *nemesis) record(e timelineEntry) {
	n.mu.Lock()
	n.timeline = append(n.timeline, e)
	n.mu.Unlock()
	line := fmt.Sprintf("chaos %6.1fs  %-26s", e.AtSeconds, e.Kind)
	if e.ForSeconds > 0 {
		line += fmt.Sprintf(" %4.1fs", e.ForSeconds)
	}
	if e.Detail != "" {
		line += "  " + e.Detail
	}
	if e.Failed {
		line += "  (FAILED)"
	}
	n.c.l.progress.note(line)
}
