package plots_test

import (
	"os"
	"path/filepath"
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
		Moments:    []plots.Marker{{Name: "faults end", At: 2}},
	})
	require.NoError(t, err)
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, want := range []string{"<svg", "commits/s", "delivery lag", "pubsub_hang", "drain_kill", "replay", "faults end"} {
		require.Contains(t, string(raw), want)
	}
}

// TestSaveFrontier writes an SVG of both charts.
func TestSaveFrontier(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "frontier.svg")
	pts := []plots.FrontierPoint{
		{GatherMS: 25, Rate: 150, DrainMS: 0.4, FloorMS: 0.2, DrainP50: 15, DrainP99: 31, FloorP50: 13, FloorP99: 26},
		{GatherMS: 85, Rate: 150, DrainMS: 0.23, FloorMS: 0.09, DrainP50: 46, DrainP99: 88, FloorP50: 43, FloorP99: 86},
		{GatherMS: 85, Rate: 500, DrainMS: 0.11, FloorMS: 0.05, DrainP50: 47, DrainP99: 88, FloorP50: 43, FloorP99: 86},
	}
	require.NoError(t, plots.SaveFrontier(path, pts, 150, 85))
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, want := range []string{"<svg", "drain p99", "floor p50", "85 ms", "commits per second"} {
		require.Contains(t, string(raw), want)
	}
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
}
