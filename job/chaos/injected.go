package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/segmentstream/ontology-replication/shared/testbench/faultproxy"
	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
)

// injection is how a fault kind shows in the part it is injected into:
// seen counts what that part took (a fault switched on in every proxy, a
// reset of every proxy's connections, a process the kernel stopped or saw
// exit, a key the issuer rotated, a server restarted); effective: only
// the timeline's entries that met something must show (a drain fault
// finds no instance while others hold them all, and says so).
type injection struct {
	seen      func(l *sandbox.Local) int
	effective bool
}

// injections are the fault kinds whose part counts what it took; the
// others show in the server's own answers (sessions ended, lock waiters,
// messages published while the warehouse stalled).
var injections = map[string]injection{
	faultPubSubRefuse: {seen: proxiesArmed(faultproxy.Refuse)},
	faultPubSubHang:   {seen: proxiesArmed(faultproxy.Hang)},
	faultPubSubLose:   {seen: proxiesArmed(faultproxy.LoseResponse)},
	faultPubSubSlow:   {seen: proxiesArmed(faultproxy.Delay)},
	faultPubSubSplit:  {seen: proxiesArmed(faultproxy.RefuseBatches)},
	faultPubSubReject: {seen: proxiesArmed(faultproxy.Reject)},
	faultPubSubReset: {seen: func(l *sandbox.Local) int {
		return leastOfProxies(l, func(p *faultproxy.GRPC) int64 { return p.Resets() })
	}},
	faultBigQuerySlow:    {seen: func(l *sandbox.Local) int { return int(l.BigqueryFaults.Armed(faultproxy.HTTPSlow)) }},
	faultBigQueryError:   {seen: func(l *sandbox.Local) int { return int(l.BigqueryFaults.Armed(faultproxy.HTTPError)) }},
	faultBigQueryDown:    {seen: func(l *sandbox.Local) int { return int(l.BigqueryFaults.Armed(faultproxy.HTTPFail)) }},
	faultKeyRotation:     {seen: func(l *sandbox.Local) int { return l.Issuer.Rotations() }},
	faultPostgresRestart: {seen: func(l *sandbox.Local) int { return l.Cluster.Restarts() }},
	faultDrainRestart:    {seen: drainsSeen(func(d *sandbox.DrainProcess) int64 { return d.Stopped.Load() }), effective: true},
	faultDrainKill:       {seen: drainsSeen(func(d *sandbox.DrainProcess) int64 { return d.Killed.Load() }), effective: true},
	faultDrainFreeze:     {seen: drainsSeen(func(d *sandbox.DrainProcess) int64 { return d.StoppedSeen.Load() }), effective: true},
}

// proxiesArmed counts a Pub/Sub fault as every component's proxy took it.
func proxiesArmed(f faultproxy.Fault) func(l *sandbox.Local) int {
	return func(l *sandbox.Local) int {
		return leastOfProxies(l, func(p *faultproxy.GRPC) int64 { return p.Armed(f) })
	}
}

// leastOfProxies is the least count among the Pub/Sub proxies: a fault
// every component's way to Pub/Sub took.
func leastOfProxies(l *sandbox.Local, count func(*faultproxy.GRPC) int64) int {
	least := -1
	for _, p := range l.PubsubProxies {
		if n := int(count(p)); least < 0 || n < least {
			least = n
		}
	}
	return max(least, 0)
}

// drainsSeen counts a drain fault as the instances' processes took it,
// summed over the instances.
func drainsSeen(count func(*sandbox.DrainProcess) int64) func(l *sandbox.Local) int {
	return func(l *sandbox.Local) int {
		n := 0
		for _, d := range l.DrainProcs {
			n += int(count(d))
		}
		return n
	}
}

// proveInjected checks that each fault the timeline reports was taken by
// its part: a fault scheduled and reported but never injected fails it.
func (c *chaosRun) proveInjected() {
	rep := c.report
	var short []string
	kinds := 0
	for _, kind := range faultKinds {
		in, ok := injections[kind]
		if !ok {
			continue
		}
		kinds++
		reported := rep.Faults[kind]
		if in.effective {
			reported = rep.FaultsEffective[kind]
		}
		if seen := in.seen(c.l); seen < reported {
			short = append(short, fmt.Sprintf("%s: %d reported, %d taken", kind, reported, seen))
		}
	}
	slices.Sort(short)
	rep.add("every fault reported was injected", len(short) == 0,
		fmt.Sprintf("%d kinds counted by the parts they hit; %d short%s", kinds, len(short), strings.Join(append([]string{""}, short...), "; ")))
}
