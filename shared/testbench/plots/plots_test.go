package plots_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/plots"
)

// TestSaveTimeline writes an SVG that names its series, its fault kinds,
// its operations and its moments.
func TestSaveTimeline(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "timeline.svg")
	err := plots.SaveTimeline(path, plots.Timeline{
		Title: "a run",
		Panels: []plots.Panel{
			{Title: "rates", YLabel: "per second", Series: []plots.Series{{Name: "commits/s", Points: []plots.XY{{0, 1}, {1, 3}, {2, 2}}}}},
			{Title: "lags", YLabel: "seconds", Series: []plots.Series{{Name: "delivery lag", Points: []plots.XY{{0, 0.1}, {2, 0.3}}}}},
		},
		Windows:    []plots.Window{{Kind: "pubsub_hang", From: 0.5, To: 1.2}, {Kind: "drain_kill", From: 1.5, To: 1.5}},
		Operations: []plots.Marker{{Name: "replay", At: 1}},
		// Close together at the axis's end: rows of their own, the last
		// one's label ending left of its line.
		Moments: []plots.Marker{{Name: "faults end", At: 1.95}, {Name: "every event verified", At: 2}},
	})
	require.NoError(t, err)
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, want := range []string{"<svg", "commits/s", "delivery lag", "pubsub_hang", "drain_kill", "replay", "faults end"} {
		require.Contains(t, string(raw), want)
	}
	requireReadable(t, raw)
	// The window is shaded in its lane and behind both panels: three
	// translucent polygons (the event, a tick in its lane, is one more).
	require.Equal(t, 4, strings.Count(string(raw), "fill-opacity:"), "pubsub_hang's window in its lane and behind each panel")
}

// TestEachFaultWindowIsABarInItsLane: lanes are the fault kinds in
// order, one a kind however many windows it has; a window's bar spans its
// seconds in its kind's lane; an event is a tick of a visible width.
func TestEachFaultWindowIsABarInItsLane(t *testing.T) {
	t.Parallel()
	windows := []plots.Window{{Kind: "pubsub_hang", From: 1, To: 5}, {Kind: "drain_kill", From: 2, To: 2}, {Kind: "pubsub_hang", From: 7, To: 8}}
	require.Equal(t, []string{"drain_kill", "pubsub_hang"}, plots.LaneKinds(windows))
	cases := []struct {
		name string
		w    plots.Window
		lane int
		want []plots.XY
	}{
		{"a window in the second lane", windows[0], 1, []plots.XY{{X: 1, Y: 0.65}, {X: 5, Y: 0.65}, {X: 5, Y: 1.35}, {X: 1, Y: 1.35}}},
		{"an event in the first lane", windows[1], 0, []plots.XY{{X: 2, Y: -0.35}, {X: 2.1, Y: -0.35}, {X: 2.1, Y: 0.35}, {X: 2, Y: 0.35}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := plots.LaneBar(c.w, c.lane, 30)
			require.Len(t, got, len(c.want))
			for i := range got {
				require.InDelta(t, c.want[i].X, got[i].X, 1e-9, "corner %d", i)
				require.InDelta(t, c.want[i].Y, got[i].Y, 1e-9, "corner %d", i)
			}
		})
	}
}

// colour matches an SVG fill or stroke colour and what follows it.
var colour = regexp.MustCompile(`(?:fill|stroke):(#[0-9A-Fa-f]*|[a-z]+)`)

// requireValidColours fails on a colour an SVG renderer cannot read: a
// hex colour is #RGB or #RRGGBB (opacity is written apart).
func requireValidColours(t *testing.T, svg []byte) {
	t.Helper()
	found := 0
	for _, m := range colour.FindAllStringSubmatch(string(svg), -1) {
		found++
		c := m[1]
		if !strings.HasPrefix(c, "#") {
			require.Contains(t, []string{"none", "black", "white"}, c)
			continue
		}
		require.Contains(t, []int{4, 7}, len(c), "colour %s is not #RGB or #RRGGBB", c)
	}
	require.Positive(t, found, "the SVG has colours")
}

// TestLabelsDoNotOverprint: labels whose spans (pixels) overlap or come
// within a gap of each other get rows of their own; those apart share the
// first.
func TestLabelsDoNotOverprint(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		spans [][2]float64
		rows  []int
	}{
		{"far apart", [][2]float64{{0, 50}, {100, 150}, {200, 250}}, []int{0, 0, 0}},
		{"two overlapping", [][2]float64{{600, 700}, {620, 760}}, []int{0, 1}},
		{"within the gap", [][2]float64{{0, 50}, {53, 80}}, []int{0, 1}},
		{"three overlapping, out of order", [][2]float64{{40, 90}, {0, 50}, {20, 70}}, []int{2, 0, 1}},
		{"a row freed again", [][2]float64{{0, 50}, {10, 60}, {60, 90}}, []int{0, 1, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.rows, plots.LabelRows(c.spans))
		})
	}
}

// TestSaveFrontier writes an SVG of both charts.
func TestSaveFrontier(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "frontier.svg")
	// PERFORMANCE.md's runs: sixteen gather labels on four curves that
	// cross, two of them at one point.
	pts := []plots.FrontierPoint{
		{GatherMS: 25, Rate: 150, DrainMS: 0.34, FloorMS: 0.19, DrainP50: 14.6, DrainP99: 27.8, FloorP50: 12.4, FloorP99: 24.7, WritersMS: 0.62},
		{GatherMS: 50, Rate: 150, DrainMS: 0.20, FloorMS: 0.11, DrainP50: 27.1, DrainP99: 51.9, FloorP50: 25.8, FloorP99: 49.2, WritersMS: 0.53},
		{GatherMS: 85, Rate: 150, DrainMS: 0.14, FloorMS: 0.07, DrainP50: 44.7, DrainP99: 86.6, FloorP50: 41.8, FloorP99: 83.7, WritersMS: 0.55},
		{GatherMS: 150, Rate: 150, DrainMS: 0.12, FloorMS: 0.06, DrainP50: 77.8, DrainP99: 152.1, FloorP50: 73.9, FloorP99: 147.4, WritersMS: 0.65},
		{GatherMS: 85, Rate: 10, DrainMS: 0.85, FloorMS: 0.68, DrainP50: 1.5, DrainP99: 3.2, FloorP50: 43.9, FloorP99: 85.1, WritersMS: 0.84},
		{GatherMS: 85, Rate: 50, DrainMS: 0.46, FloorMS: 0.17, DrainP50: 23.4, DrainP99: 86.1, FloorP50: 44.4, FloorP99: 84.9, WritersMS: 0.82},
		{GatherMS: 85, Rate: 300, DrainMS: 0.11, FloorMS: 0.05, DrainP50: 45.2, DrainP99: 87.7, FloorP50: 41.7, FloorP99: 83.6, WritersMS: 0.52},
		{GatherMS: 85, Rate: 500, DrainMS: 0.11, FloorMS: 0.05, DrainP50: 47, DrainP99: 87.7, FloorP50: 43, FloorP99: 86, WritersMS: 0.6},
	}
	require.NoError(t, plots.SaveFrontier(path, pts, 150, 85))
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, want := range []string{"<svg", "drain p99", "floor p50", "85 ms", "commits per second", "SPEC bar: p99 100 ms",
		"SPEC bar: 0.3× the writers", "floor: the least SQL"} {
		require.Contains(t, string(raw), want)
	}
	requireReadable(t, raw)
}

// TestSaveFrontierAsItGrows: the benchmark draws the frontier after each
// rate it measured, so the first draws have one point, or none in a
// panel; none of them fails (a log axis over one rate would span 0).
func TestSaveFrontierAsItGrows(t *testing.T) {
	t.Parallel()
	for _, pts := range [][]plots.FrontierPoint{
		{{GatherMS: 85, Rate: 1, DrainMS: 4.8, FloorMS: 7.5, DrainP50: 6, DrainP99: 48, FloorP50: 37, FloorP99: 81}},
		{{GatherMS: 25, Rate: 150, DrainMS: 0.4, FloorMS: 0.2, DrainP50: 15, DrainP99: 31, FloorP50: 13, FloorP99: 26}},
		nil,
	} {
		require.NoError(t, plots.SaveFrontier(filepath.Join(t.TempDir(), "frontier.svg"), pts, 150, 85), "%+v", pts)
	}
}

// TestSaveAnswers writes an SVG of both charts, with a run that has no
// figure yet (0 on a log axis).
func TestSaveAnswers(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "answers.svg")
	require.NoError(t, plots.SaveAnswers(path, []plots.AnswerRun{
		{Label: "before, fast", AnswerP50: 0.4, AnswerP99: 345, AnswerMax: 355, AcceptedP50: 44, AcceptedP99: 86, Achieved: 147},
		{Label: "after, slow", AnswerP50: 0.3, AnswerP99: 0.9, AnswerMax: 3.4, AcceptedP50: 1090, AcceptedP99: 2046, Achieved: 150},
		{Label: "empty"},
	}))
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, want := range []string{"<svg", "before, fast", "commit → accepted", "p99 bar 20 ms"} {
		require.Contains(t, string(raw), want)
	}
	requireReadable(t, raw)
}

// TestTheCommittedPicturesRead: the pictures the READMEs show (drawn by
// runs, committed) are well-formed, have only colours an SVG renderer
// reads, and no text overprints another.
func TestTheCommittedPicturesRead(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"job/chaos/chaos.svg", "functions/wakeup-frontier.svg", "functions/wakeup-answers.svg", "functions/wakeup-fleet.svg"} {
		t.Run(path, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("..", "..", "..", path))
			require.NoError(t, err)
			requireReadable(t, raw)
		})
	}
}

// fleetRuns are PERFORMANCE.md's fleet runs.
var fleetRuns = []plots.FleetRun{
	{Workspaces: 1, CPUShare: 0.25, Sessions: 0, AcceptedP99: 87},
	{Workspaces: 1, Pooled: true, CPUShare: 0.29, Sessions: 0, AcceptedP99: 87},
	{Workspaces: 50, CPUShare: 11.7, Sessions: 0.81, AcceptedP99: 617},
	{Workspaces: 50, Pooled: true, CPUShare: 2.4, Sessions: 0.003, AcceptedP99: 44},
	{Workspaces: 200, CPUShare: 12.8, Sessions: 0.95, AcceptedP99: 1305},
	{Workspaces: 200, Pooled: true, CPUShare: 2.8, Sessions: 0.019, AcceptedP99: 196},
	{Workspaces: 1000, CPUShare: 11.6, Sessions: 0.98, AcceptedP99: 4110},
	{Workspaces: 1000, Pooled: true, CPUShare: 2.7, Sessions: 0.019, AcceptedP99: 13586},
	{Workspaces: 1000, Zipf: true, CPUShare: 11.4, Sessions: 0.77, AcceptedP99: 2354},
	{Workspaces: 1000, Pooled: true, Zipf: true, CPUShare: 2.8, Sessions: 0.006, AcceptedP99: 717},
}

// TestSaveFleet writes an SVG of the three charts, each with its bar, a
// line a way and spread.
func TestSaveFleet(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "fleet.svg")
	require.NoError(t, plots.SaveFleet(path, fleetRuns))
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, want := range []string{"<svg", "pooled, uniform", "direct, Zipf", "bar 0.8×", "bar 0.05", "bar 250 ms", "workspace databases"} {
		require.Contains(t, string(raw), want)
	}
	requireReadable(t, raw)
	require.NoError(t, plots.SaveFleet(path, nil), "before any run")
}
