package plots_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/plot/plotter"

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
		Moments:    []plots.Marker{{Name: "faults end", At: 2}},
	})
	require.NoError(t, err)
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, want := range []string{"<svg", "commits/s", "delivery lag", "pubsub_hang", "drain_kill", "replay", "faults end"} {
		require.Contains(t, string(raw), want)
	}
	requireValidColours(t, raw)
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
		want plotter.XYs
	}{
		{"a window in the second lane", windows[0], 1, plotter.XYs{{X: 1, Y: 0.65}, {X: 5, Y: 0.65}, {X: 5, Y: 1.35}, {X: 1, Y: 1.35}}},
		{"an event in the first lane", windows[1], 0, plotter.XYs{{X: 2, Y: -0.35}, {X: 2.1, Y: -0.35}, {X: 2.1, Y: 0.35}, {X: 2, Y: 0.35}}},
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

// TestLabelsDoNotOverprint: markers closer than a label's width get rows
// of their own; those a label apart share the first.
func TestLabelsDoNotOverprint(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		markers []plots.Marker
		rows    []int
	}{
		{"far apart", []plots.Marker{{"a", 0}, {"b", 50}, {"c", 99}}, []int{0, 0, 0}},
		{"two close", []plots.Marker{{"faults end", 60}, {"every event verified", 62}}, []int{0, 1}},
		{"three close, out of order", []plots.Marker{{"c", 4}, {"a", 0}, {"b", 2}}, []int{2, 0, 1}},
		{"a row freed again", []plots.Marker{{"a", 0}, {"b", 1}, {"c", 25}}, []int{0, 1, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.rows, plots.LabelRows(c.markers, 100))
		})
	}
}

// TestSaveFrontier writes an SVG of both charts.
func TestSaveFrontier(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "frontier.svg")
	pts := []plots.FrontierPoint{
		{GatherMS: 25, Rate: 150, DrainMS: 0.4, FloorMS: 0.2, DrainP50: 15, DrainP99: 31, FloorP50: 13, FloorP99: 26},
		{GatherMS: 85, Rate: 150, DrainMS: 0.23, FloorMS: 0.09, DrainP50: 46, DrainP99: 88, FloorP50: 43, FloorP99: 86},
		{GatherMS: 85, Rate: 500, DrainMS: 0.11, FloorMS: 0.05, DrainP50: 47, DrainP99: 88, FloorP50: 43, FloorP99: 86, WritersMS: 0.6},
	}
	require.NoError(t, plots.SaveFrontier(path, pts, 150, 85))
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, want := range []string{"<svg", "drain p99", "floor p50", "85 ms", "commits per second", "SPEC bar: p99 100 ms",
		"SPEC bar: 0.3× the writers", "floor: the least SQL"} {
		require.Contains(t, string(raw), want)
	}
	requireValidColours(t, raw)
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
	requireValidColours(t, raw)
}

// TestTheCommittedPicturesHaveValidColours: the pictures the READMEs show
// (drawn by runs, committed) have only colours an SVG renderer reads.
func TestTheCommittedPicturesHaveValidColours(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"job/chaos/chaos.svg", "functions/wakeup-frontier.svg", "functions/wakeup-answers.svg"} {
		t.Run(path, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("..", "..", "..", path))
			require.NoError(t, err)
			requireValidColours(t, raw)
		})
	}
}
