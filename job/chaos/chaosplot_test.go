package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/plots"
	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
)

// TestChaosTimelinePutsEachFaultInItsLane: the chaos picture shows each
// fault window in its kind's lane over the seconds it lasted (an event a
// tick at its moment), each operation's start and end as a marker, and the
// faults' end and full verification as moments; rates are per second.
func TestChaosTimelinePutsEachFaultInItsLane(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	samples := []sandbox.Sampled{
		{At: t0, Commits: 0, Published: 0},
		{At: t0.Add(500 * time.Millisecond), Commits: 10, Published: 5, DeliveryLag: 2 * time.Second},
		{At: t0.Add(time.Second), Commits: 40, Published: 30, VerificationLag: 3 * time.Second},
	}
	timeline := []timelineEntry{
		{AtSeconds: 1, Kind: faultPubSubHang, ForSeconds: 4},
		{AtSeconds: 2, Kind: faultDrainKill},
		{AtSeconds: 3, Kind: opReplay},
		{AtSeconds: 6, Kind: opReplay + "_done", ForSeconds: 3},
		{AtSeconds: 7, Kind: faultPubSubHang, ForSeconds: 0.5},
	}
	tl := chaosTimeline("a run", t0, samples, timeline, t0.Add(10*time.Second), 2.5)
	require.Equal(t, []plots.Window{
		{Kind: faultPubSubHang, From: 1, To: 5},
		{Kind: faultDrainKill, From: 2, To: 2},
		{Kind: faultPubSubHang, From: 7, To: 7.5},
	}, tl.Windows)
	require.Equal(t, []plots.Marker{{Name: "replay", At: 3}, {Name: "replay done", At: 6}}, tl.Operations)
	require.Equal(t, []plots.Marker{{Name: "faults end", At: 10}, {Name: "every event verified", At: 12.5}}, tl.Moments)
	require.Len(t, tl.Panels, 2)
	rates := tl.Panels[0].Series
	require.Equal(t, []plots.XY{{X: 0.5, Y: 20}, {X: 1, Y: 40}}, rates[0].Points, "commits a second over the last second")
	require.Equal(t, []plots.XY{{X: 0.5, Y: 10}, {X: 1, Y: 30}}, rates[1].Points, "publishes a second over the last second")
	lags := tl.Panels[1].Series
	require.Equal(t, plots.XY{X: 0.5, Y: 2}, lags[0].Points[1])
	require.Equal(t, plots.XY{X: 1, Y: 3}, lags[1].Points[2])

	unverified := chaosTimeline("a run", t0, samples, nil, t0.Add(10*time.Second), -1)
	require.Equal(t, []plots.Marker{{Name: "faults end", At: 10}}, unverified.Moments, "no full verification, no moment")
}
