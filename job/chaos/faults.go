package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/segmentstream/ontology-replication/shared/testbench/faultproxy"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// wires serialise the faults of one wire: a Pub/Sub window waits for the
// one before it to end (they set the same switch), and so do BigQuery's.
var wires struct{ pubsub, bigquery sync.Mutex }

// inject applies one fault, holds it for its window, and records and
// returns what it met (Effect: a fault that met nothing took no effect).
func (n *nemesis) inject(ctx context.Context, s step) int {
	l := n.c.l
	at := time.Since(n.c.started)
	var detail string
	effect, failed := 0, false
	switch s.Kind {
	case faultEndDrainSessions, faultEndVerifySessions, faultEndJobSessions:
		names := map[string][]string{faultEndVerifySessions: {sandbox.ComponentVerify}, faultEndJobSessions: {sandbox.ComponentJob}}[s.Kind]
		for _, p := range l.DrainProcs {
			if s.Kind == faultEndDrainSessions {
				names = append(names, p.Name)
			}
		}
		for _, name := range names {
			ended, err := pgtest.TerminateBackends(context.WithoutCancel(ctx), l.Ontology, name)
			effect, failed = effect+ended, failed || err != nil
		}
		detail = fmt.Sprintf("%d sessions of %s ended", effect, strings.Join(names, ", "))
	case faultPubSubRefuse, faultPubSubHang, faultPubSubLose, faultPubSubSlow, faultPubSubSplit, faultPubSubReject:
		detail, effect = n.pubsubWindow(ctx, s)
	case faultPubSubReset:
		for _, p := range l.PubsubProxies {
			effect += p.Reset()
		}
		detail = fmt.Sprintf("%d connections reset", effect)
	case faultBigQuerySlow, faultBigQueryError, faultBigQueryDown:
		detail, effect = n.bigqueryWindow(ctx, s)
	case faultWarehouseStall:
		detail, effect = n.stall(ctx, s.For)
	case faultKeyRotation:
		detail, effect, failed = n.rotate(ctx)
	case faultDrainRestart, faultDrainKill, faultDrainFreeze:
		detail, effect, failed = n.drainFault(ctx, s)
	case faultMigration:
		detail, effect, failed = n.migration(ctx, s.For)
	case faultPostgresRestart:
		sessions, err := l.Cluster.Restart(context.WithoutCancel(ctx))
		effect, failed = sessions, err != nil
		detail = fmt.Sprintf("the PostgreSQL server restarted (fast): %d sessions ended", sessions)
	}
	n.record(timelineEntry{AtSeconds: at.Seconds(), Kind: s.Kind, ForSeconds: s.For.Seconds(), Detail: detail, Effect: effect, Failed: failed})
	return effect
}

// awaitWakeUp waits, up to within, for a wake-up to be in flight: a wire
// fault then meets the drains (the SDK pauses between bursts).
func (n *nemesis) awaitWakeUp(ctx context.Context, within time.Duration) {
	for deadline := time.Now().Add(within); n.c.wakes.InFlight.Load() == 0 && time.Now().Before(deadline) && ctx.Err() == nil; {
		time.Sleep(5 * time.Millisecond) // the counter is the signal
	}
}

// pubsubWindow puts a fault on every component's way to Pub/Sub for the
// window and says how many publishes met it.
func (n *nemesis) pubsubWindow(ctx context.Context, s step) (string, int) {
	f := map[string]faultproxy.Fault{faultPubSubRefuse: faultproxy.Refuse, faultPubSubHang: faultproxy.Hang, faultPubSubLose: faultproxy.LoseResponse,
		faultPubSubSlow: faultproxy.Delay, faultPubSubSplit: faultproxy.RefuseBatches, faultPubSubReject: faultproxy.Reject}[s.Kind]
	wires.pubsub.Lock()
	defer wires.pubsub.Unlock()
	n.awaitWakeUp(ctx, 3*time.Second)
	proxies := n.c.l.PubsubProxies
	delay := 2500*time.Millisecond + time.Duration(n.randInt64(int64(time.Second)))
	var before int64
	for _, p := range proxies {
		before += p.Count(f)
		p.SetDelay(delay)
		p.Set(f)
	}
	sandbox.SleepUntil(ctx, time.Now().Add(s.For))
	var after int64
	for _, p := range proxies {
		p.Set(faultproxy.Pass)
		after += p.Count(f)
	}
	met := int(after - before)
	switch s.Kind {
	case faultPubSubSlow:
		return fmt.Sprintf("%d publishes held %.1fs each (longer than the drain's 2 s slice)", met, delay.Seconds()), met
	case faultPubSubSplit:
		return fmt.Sprintf("%d publishes of more than one message refused (RESOURCE_EXHAUSTED): claims accepted in part", met), met
	case faultPubSubReject:
		retried := n.retrySetAside(ctx)
		return fmt.Sprintf("%d publishes refused as invalid (INVALID_ARGUMENT); %d events set aside, retried as an operator does (job set-aside --retry)",
			met, retried), met
	}
	return fmt.Sprintf("%d publishes met it", met), met
}

// bigqueryWindow puts a fault on the verifier's way to BigQuery for the
// window; bigquery_down_stalled fails every request at once (an error the
// client does not retry, so that a lookup fails within the window, where a
// 5xx is retried to the lookup's 20 s time-out) and stalls the
// subscription, so that the lookups fail while the events published
// meanwhile are absent.
func (n *nemesis) bigqueryWindow(ctx context.Context, s step) (string, int) {
	l := n.c.l
	f := map[string]faultproxy.HTTPFault{faultBigQuerySlow: faultproxy.HTTPSlow, faultBigQueryError: faultproxy.HTTPError,
		faultBigQueryDown: faultproxy.HTTPFail}[s.Kind]
	wires.bigquery.Lock()
	defer wires.bigquery.Unlock()
	if s.Kind == faultBigQueryDown {
		n.c.stalled.Add(1)
		defer n.c.stalled.Add(-1)
	}
	before, passes := l.BigqueryFaults.Count(f), n.c.failedPasses.Load()
	l.BigqueryFaults.Set(f)
	sandbox.SleepUntil(ctx, time.Now().Add(s.For))
	l.BigqueryFaults.Set(faultproxy.HTTPPass)
	met := int(l.BigqueryFaults.Count(f) - before)
	if s.Kind == faultBigQueryDown {
		failed := int(n.c.failedPasses.Load() - passes)
		return fmt.Sprintf("%d BigQuery requests failed at once (400, not retried) while the subscription wrote nothing; %d verifier passes failed", met, failed), failed
	}
	return fmt.Sprintf("%d BigQuery requests met it", met), met
}

// stall holds the BigQuery subscription's writes for d (the events
// published meanwhile land late, and the verifier finds them absent) and
// says how many messages were published meanwhile.
func (n *nemesis) stall(ctx context.Context, d time.Duration) (string, int) {
	before := readPublished(n.c.l).messages
	n.c.stalled.Add(1)
	sandbox.SleepUntil(ctx, time.Now().Add(d))
	n.c.stalled.Add(-1)
	met := readPublished(n.c.l).messages - before
	return fmt.Sprintf("the BigQuery subscription wrote nothing while %d messages were published", met), met
}

// rotate serves a new key only and signs with it; it met the wake-ups sent
// in the 5 s after.
func (n *nemesis) rotate(ctx context.Context) (string, int, bool) {
	n.mu.Lock()
	n.rotation++
	kid := fmt.Sprintf("local-key-%d", n.rotation)
	n.mu.Unlock()
	err := n.c.l.Issuer.Rotate(kid)
	before := n.c.wakes.Started.Load()
	sandbox.SleepUntil(ctx, time.Now().Add(5*time.Second))
	met := int(n.c.wakes.Started.Load() - before)
	return fmt.Sprintf("new key %s served, the old one removed, tokens signed again; %d wake-ups in the 5 s after", kid, met), met, err != nil
}

// drainFault restarts, kills or freezes one drain instance: one whose
// session holds a turn lock, if one does within 3 s (a turn held by an
// instance that dies or hangs is what the others must outlive), or else
// one with wake-ups in flight. Its span is one of the drain's own faults.
func (n *nemesis) drainFault(ctx context.Context, s step) (string, int, bool) {
	l := n.c.l
	var proc *sandbox.DrainProcess
	held := false
	for deadline := time.Now().Add(3 * time.Second); proc == nil && time.Now().Before(deadline) && ctx.Err() == nil; {
		holders, _ := sdkfixture.TurnHolders(ctx, l.Ontology)
		for _, p := range l.DrainProcs {
			// A SIGTERM is for a process in the middle of its drainers'
			// work; a kill or freeze, for one holding a turn.
			busy := slices.Contains(holders, p.Name)
			if s.Kind == faultDrainRestart {
				busy = p.Running.Load() > 0
			}
			if busy && n.claim(p) {
				proc, held = p, slices.Contains(holders, p.Name)
				break
			}
		}
		if proc == nil {
			time.Sleep(2 * time.Millisecond) // the server's lock table is the signal
		}
	}
	if proc == nil { // none held a turn: one with wake-ups in flight, if any
		n.mu.Lock()
		order := n.rng.Perm(len(l.DrainProcs))
		n.mu.Unlock()
		slices.SortStableFunc(order, func(a, b int) int {
			return int(n.c.wakes.PerDrain[b].Load() - n.c.wakes.PerDrain[a].Load())
		})
		for _, i := range order {
			if n.claim(l.DrainProcs[i]) {
				proc = l.DrainProcs[i]
				break
			}
		}
	}
	if proc == nil {
		return "every drain instance is held by another fault", 0, false
	}
	defer n.release(proc)
	started := time.Now()
	inFlight := n.c.wakes.PerDrain[proc.Index].Load()
	why := map[bool]string{true: "holding a turn lock", false: "holding no turn lock"}[held]
	// It met something if it held a turn, or cut wake-ups in flight.
	effect := int(min(inFlight, 1))
	if held {
		effect = 1
	}
	var detail string
	var err error
	switch s.Kind {
	case faultDrainRestart:
		// As Cloud Run stops an instance: SIGTERM, SIGKILL 10 s later; the
		// drain's grace (8 s) lets its drainers finish their batches out.
		running, left := proc.Running.Load(), proc.Left.Snapshot()
		var res sandbox.RestartResult
		res, err = proc.Restart(context.WithoutCancel(ctx), 10*time.Second)
		detail = fmt.Sprintf("SIGTERM to %s (%s) with %s running and %d wake-ups in flight; ended in %.1fs%s, leaving %s; a new process serves",
			proc.Name, why, sandbox.Plural(int(running), "drainer"), inFlight, res.Stopped.Seconds(), map[bool]string{true: " by SIGKILL", false: ""}[res.Killed],
			proc.Left.Since(left))
		effect = int(min(running, 1) + min(inFlight, 1))
		// A stop within the grace that left nothing keeps every promise
		// (SPEC §3): only one that was killed or said it left work may
		// break one.
		if res.Killed || proc.Left.Snapshot().Drainers > left.Drainers {
			n.recordOwn(s.Kind, proc.Index, started)
		}
	case faultDrainKill:
		n.recordOwn(s.Kind, proc.Index, started)
		err = proc.Kill(context.WithoutCancel(ctx))
		detail = fmt.Sprintf("SIGKILL to %s (%s) with %d wake-ups in flight; a new process serves", proc.Name, why, inFlight)
	case faultDrainFreeze:
		n.recordOwn(s.Kind, proc.Index, started)
		proc.Freeze(ctx, s.For)
		detail = fmt.Sprintf("SIGSTOP to %s (%s) for %.0fs, then SIGCONT", proc.Name, why, s.For.Seconds())
	}
	return detail, effect, err != nil
}

// recordOwn records a fault of drain instance drain at from that may break
// its promises made before it (see excusals).
func (n *nemesis) recordOwn(kind string, drain int, from time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.own = append(n.own, window{Kind: kind, Drain: drain, From: from})
}

// claim marks an instance as held by a fault, unless another holds it.
func (n *nemesis) claim(p *sandbox.DrainProcess) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.busy[p.Index] {
		return false
	}
	n.busy[p.Index] = true
	return true
}

func (n *nemesis) release(p *sandbox.DrainProcess) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.busy, p.Index)
}

// migration holds the SDK's lifecycle lock exclusively for d, as an SDK
// migration does, past the lock timeout of everyone who waits for it (the
// SDK's writers, the drains' claims and acknowledgements); it met the
// sessions that waited.
func (n *nemesis) migration(ctx context.Context, d time.Duration) (string, int, bool) {
	l := n.c.l
	release, err := sdkfixture.HoldLifecycleLock(context.WithoutCancel(ctx), l.Ontology)
	if err != nil {
		return err.Error(), 0, true
	}
	most := 0
	for end := time.Now().Add(d); time.Now().Before(end) && ctx.Err() == nil; {
		if waiting, err := sdkfixture.LifecycleWaiters(ctx, l.Ontology); err == nil {
			most = max(most, waiting)
		}
		time.Sleep(50 * time.Millisecond) // sampling the server's lock table
	}
	release()
	return fmt.Sprintf("the SDK's lifecycle lock held exclusively for %.1fs; up to %d sessions waited for it", d.Seconds(), most), most, false
}

// randInt64 draws from the nemesis's own source.
func (n *nemesis) randInt64(limit int64) int64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.rng.Int64N(limit)
}

// retrySetAside does what an operator does once Pub/Sub stops refusing
// content: `job set-aside --retry`, until a retry 2 s or more after the
// window finds nothing set aside (what a publish refused at the window's
// end sets aside a moment later), or for 10 s. It returns how many events it retried.
func (n *nemesis) retrySetAside(ctx context.Context) int {
	retried, settled := 0, time.Now().Add(2*time.Second)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; {
		res, err := n.c.l.Svc.SetAsideEvents(ctx, sandbox.LocalWorkspace, 1000, true)
		if err == nil {
			retried += int(res.Retried)
			if res.SetAside.Count == 0 && res.Retried == 0 && time.Now().After(settled) {
				return retried
			}
		}
		sandbox.SleepUntil(ctx, time.Now().Add(500*time.Millisecond))
	}
	return retried
}
