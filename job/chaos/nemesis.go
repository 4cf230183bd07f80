package main

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/faultproxy"
	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// The nemesis's fault kinds. Each reaches the product only through a
// boundary production has: its database sessions and server, the SDK's
// lifecycle lock, the wire to Pub/Sub and to BigQuery, the issuer's key
// set, the drain instances' processes.
const (
	faultEndDrainSessions  = "end_drain_sessions"
	faultEndVerifySessions = "end_verifier_sessions"
	faultEndJobSessions    = "end_job_sessions"
	faultPubSubRefuse      = "pubsub_refuse"
	faultPubSubHang        = "pubsub_hang"
	faultPubSubLose        = "pubsub_lose_response"
	faultPubSubReset       = "pubsub_reset_connections"
	faultPubSubSlow        = "pubsub_slow"
	faultPubSubSplit       = "pubsub_split"
	faultPubSubReject      = "pubsub_invalid_argument"
	faultBigQuerySlow      = "bigquery_slow"
	faultBigQueryError     = "bigquery_5xx"
	faultBigQueryDown      = "bigquery_down_stalled"
	faultKeyRotation       = "key_rotation"
	faultDrainRestart      = "drain_restart"
	faultDrainKill         = "drain_kill"
	faultDrainFreeze       = "drain_freeze"
	faultWarehouseStall    = "warehouse_stall"
	faultMigration         = "migration"
	faultPostgresRestart   = "postgres_restart"
)

// faultKinds lists every fault kind; each schedule has all of them.
var faultKinds = []string{faultEndDrainSessions, faultEndVerifySessions, faultEndJobSessions, faultPubSubRefuse, faultPubSubHang,
	faultPubSubLose, faultPubSubReset, faultPubSubSlow, faultPubSubSplit, faultPubSubReject, faultBigQuerySlow, faultBigQueryError, faultBigQueryDown,
	faultKeyRotation, faultDrainRestart, faultDrainKill, faultDrainFreeze, faultWarehouseStall, faultMigration, faultPostgresRestart}

// drainOwnFaults are the faults of a drain instance itself: while one
// lasts, a promise resting on that instance's drain may be broken by the
// fault (see excusals).
var drainOwnFaults = []string{faultDrainRestart, faultDrainKill, faultDrainFreeze}

// freezeFor is how long a drain_freeze holds an instance: longer than the
// drains' wait for a turn (20 s), so that the others' waits for the turns
// it holds time out unless the server ends its sessions first.
const freezeFor = 22 * time.Second

// bigqueryDownFor is the least length of a bigquery_down_stalled window.
const bigqueryDownFor = 8 * time.Second

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
		kinds := slices.DeleteFunc(slices.Clone(faultKinds), func(k string) bool { return k == faultDrainFreeze || k == faultBigQueryDown })
		rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
		// The long windows need room to end within the run: first in a
		// round.
		kinds = append([]string{faultDrainFreeze, faultBigQueryDown}, kinds...)
		for _, k := range kinds {
			if at >= d*9/10 {
				break
			}
			switch {
			case k == faultKeyRotation:
				rotationDue = true
				continue
			case (k == faultDrainFreeze || k == faultBigQueryDown) && at+windowOf(k, gap, nil) > d:
				continue
			}
			if rotationDue && at-lastRotation >= rotationSpacing {
				steps = append(steps, step{At: at, Kind: faultKeyRotation})
				lastRotation, rotationDue = at, false
				at += gap*3/4 + time.Duration(rng.Int64N(int64(gap/2)))
			}
			s := step{At: at, Kind: k, For: windowOf(k, gap, rng)}
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

// windowOf is how long a fault of kind k lasts (0: it is an event, not a
// window).
func windowOf(k string, gap time.Duration, rng *rand.Rand) time.Duration {
	switch k {
	case faultPubSubRefuse, faultPubSubHang, faultPubSubLose, faultPubSubReject:
		return gap/2 + time.Duration(rng.Int64N(int64(gap/2)))
	case faultPubSubSlow, faultPubSubSplit, faultBigQuerySlow, faultBigQueryError, faultWarehouseStall:
		// Long enough for a drain's publishes, or a verifier pass, to meet it.
		return 3*time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
	case faultBigQueryDown:
		// Long enough for several verifier passes to fail their lookups
		// while the events published meanwhile are absent.
		if rng == nil {
			return bigqueryDownFor
		}
		return bigqueryDownFor + time.Duration(rng.Int64N(int64(2*time.Second)))
	case faultMigration:
		// Past the SDK's lock timeout (5 s), the drains' included.
		return 6*time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
	case faultDrainFreeze:
		return freezeFor
	}
	return 0
}

// rotationSpacing is the least time between key rotations.
const rotationSpacing = 35 * time.Second

// timelineEntry is one fault or operation as it happened.
type timelineEntry struct {
	AtSeconds  float64 `json:"at_seconds"`
	Kind       string  `json:"kind"`
	ForSeconds float64 `json:"for_seconds,omitempty"`
	Detail     string  `json:"detail,omitempty"`
	// Effect counts what the fault met (publishes, sessions, requests,
	// passes failed…); a fault that met nothing took no effect.
	Effect int  `json:"effect"`
	Failed bool `json:"failed,omitempty"`
}

// nemesis injects the schedule's faults and starts its operations,
// printing each as it goes.
type nemesis struct {
	c     *chaosRun
	steps []step
	rng   *rand.Rand

	mu       sync.Mutex
	timeline []timelineEntry
	rotation int
	// own are the drain's own faults' spans (see excusals).
	own excusals
	// busy are the drain instances a fault holds (a freeze, a restart).
	busy map[int]bool
}

func newNemesis(c *chaosRun, cfg chaosConfig) *nemesis {
	return &nemesis{c: c, steps: schedule(cfg.seed, cfg.duration), rng: rand.New(rand.NewPCG(cfg.seed, 7)), busy: map[int]bool{}}
}

// holds reports whether a fault holds drain instance i now.
func (n *nemesis) holds(i int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.busy[i]
}

// excusals returns the drain's own faults' spans so far.
func (n *nemesis) excusals() excusals {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.own)
}

// run injects the faults until ctx ends (the duration), in the schedule's
// order, each at its time and in the background, so that windows overlap;
// the operations run beside them, one after another, each started at its
// time even on a machine so slow that the faults ended first, and stopped
// only by opsCtx. When it returns every fault is off.
func (n *nemesis) run(ctx, opsCtx context.Context) {
	start := n.c.started
	var ops []step
	for _, s := range n.steps {
		if s.Kind == opReplay || s.Kind == opPartialReplay || s.Kind == opJobDrain {
			ops = append(ops, s)
		}
	}
	n.c.opsWG.Go(func() { n.runOperations(opsCtx, ops) })
	var windows sync.WaitGroup
	defer func() {
		windows.Wait()
		n.allOff()
	}()
	for _, s := range n.steps {
		if s.Kind == opReplay || s.Kind == opPartialReplay || s.Kind == opJobDrain {
			continue
		}
		if !sandbox.SleepUntil(ctx, start.Add(s.At)) {
			return
		}
		windows.Go(func() {
			// A fault that met nothing (the SDK paused, say) is tried
			// again (attemptsOf): only a fault that took effect counts.
			for attempt := 0; attempt < attemptsOf(s.Kind) && ctx.Err() == nil; attempt++ {
				if n.inject(ctx, s) > 0 || !sandbox.SleepUntil(ctx, time.Now().Add(4*time.Second)) {
					return
				}
			}
		})
	}
	<-ctx.Done()
}

// attemptsOf is how many times a fault of kind is tried while it meets
// nothing: three, but a key rotation once, as the schedule spaces them
// (rotationSpacing): one more 4 s later would have every wake-up refused
// until the drain may fetch the keys again.
func attemptsOf(kind string) int {
	if kind == faultKeyRotation {
		return 1
	}
	return 3
}

// allOff ends every fault.
func (n *nemesis) allOff() {
	for _, p := range n.c.l.PubsubProxies {
		p.Set(faultproxy.Pass)
	}
	n.c.l.BigqueryFaults.Set(faultproxy.HTTPPass)
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
		if !sandbox.SleepUntil(ctx, n.c.started.Add(s.At)) {
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
		start := timelineEntry{AtSeconds: time.Since(n.c.started).Seconds(), Kind: s.Kind, Effect: 1}
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
			res, err = l.Svc.Replay(ctx, sandbox.LocalWorkspace, delivery.PagesOptions{Progress: delivery.NoProgress{}})
			detail = fmt.Sprintf("%d events sent back and published again", res.Rows)
		case opPartialReplay:
			var res delivery.PagesResult
			res, err = l.Svc.ReplayPartial(ctx, sandbox.LocalWorkspace, delivery.PagesOptions{Progress: delivery.NoProgress{}},
				delivery.ReplaySelection{Entities: []string{partialEntity}})
			detail = fmt.Sprintf("%d %s events sent back and published again", res.Rows, partialEntity)
		case opJobDrain:
			var res delivery.DrainAllResult
			res, err = l.Svc.DrainAll(ctx, sandbox.LocalWorkspace, delivery.DrainAllOptions{})
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
			Detail: detail, Effect: 1, Failed: err != nil})
	}
}

// acceptedEvents returns the event ids of a history table's accepted
// events.
func (n *nemesis) acceptedEvents(ctx context.Context, historyTable string) (map[string]bool, error) {
	rows, err := sdkfixture.DeliveryRows(ctx, n.c.l.Ontology, n.c.l.Gen)
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
	n.c.l.Progress.Note(line)
}
