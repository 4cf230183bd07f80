package plots

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTheDataSitInTheFrameUnderTheLegend: every point of a series and
// corner of a shaded polygon lies in the frame below the legend's
// headroom, and none in the legend's box, however high the data reach.
func TestTheDataSitInTheFrameUnderTheLegend(t *testing.T) {
	t.Parallel()
	timeline := Timeline{
		Panels: []Panel{{Series: []Series{{Name: "commits/s", Points: []XY{{0, 5}, {30, 900}, {60, 3}}},
			{Name: "messages published/s", Points: []XY{{0, 1}, {60, 900}}}}}},
		Windows: []Window{{Kind: "pubsub_hang", From: 50, To: 60}},
	}
	points := []FrontierPoint{
		{GatherMS: 25, Rate: 150, DrainMS: 0.34, FloorMS: 0.19, DrainP50: 14.6, DrainP99: 152, FloorP50: 12.4, FloorP99: 24.7, WritersMS: 0.62},
		{GatherMS: 150, Rate: 150, DrainMS: 0.12, FloorMS: 0.06, DrainP50: 77.8, DrainP99: 180, FloorP50: 73.9, FloorP99: 147.4, WritersMS: 3},
		// Out of order, as the benchmark records them.
		{GatherMS: 85, Rate: 300, DrainMS: 1.2, FloorMS: 0.05, DrainP50: 45.2, DrainP99: 87.7, FloorP50: 41.7, FloorP99: 83.6, WritersMS: 0.52},
		{GatherMS: 85, Rate: 10, DrainMS: 0.85, FloorMS: 0.68, DrainP50: 1.5, DrainP99: 3.2, FloorP50: 43.9, FloorP99: 85.1, WritersMS: 0.84},
	}
	runs := []AnswerRun{{Label: "slow", AnswerP50: 1, AnswerP99: 5001, AnswerMax: 9000}, {Label: "held", AnswerMax: 40000}}
	cases := []struct {
		name  string
		chart *chart
	}{
		{"a timeline's panel", panel(timeline.Panels[0], timeline, laneKinds(timeline.Windows), 60)},
		{"the frontier's latency chart", frontierCharts(points, 150, 85)[0]},
		{"the frontier's cost chart", frontierCharts(points, 150, 85)[1]},
		{"the answers", runsPanel("answers", []string{"slow", "held"}, []runCurve{
			{"max", func(r AnswerRun) float64 { return r.AnswerMax }}}, runs, []Marker{{Name: "5 s", At: 5000}})},
	}
	fleet := fleetCharts([]FleetRun{{Workspaces: 1, CPUShare: 0.2, Sessions: 0, AcceptedP99: 80},
		{Workspaces: 1000, Pooled: true, CPUShare: 12, Sessions: 0.9, AcceptedP99: 13000}})
	for i, c := range fleet {
		cases = append(cases, struct {
			name  string
			chart *chart
		}{fmt.Sprintf("the fleet's chart %d", i), c})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := frame{x0: 120, y0: 40, w: 900, h: c.chart.frameHeight}
			legend := c.chart.drawLegend(&canvas{}, f)
			if !strings.HasPrefix(c.name, "the fleet's chart") || c.name == "the fleet's chart 0" { // the fleet's others have none
				require.Greater(t, legend.y1, legend.y0, "the chart has a legend")
			}
			const px = 1e-6 // rounding
			inLegend := func(p XY) bool { return p.X >= legend.x0 && p.X <= legend.x1 && p.Y < legend.y1 }
			inFrame := func(p XY) bool {
				return p.X >= f.x0-px && p.X <= f.x0+f.w+px && p.Y >= f.y0+c.chart.legendHeight()-px && p.Y <= f.y0+f.h+px
			}
			var pts []XY
			for _, s := range c.chart.series {
				pts = append(pts, c.chart.mapped(f, s.pts)...)
			}
			for _, pg := range c.chart.polygons {
				pts = append(pts, c.chart.mapped(f, pg.pts)...)
			}
			for _, p := range pts {
				require.True(t, inFrame(p), "%v outside the frame %+v", p, f)
				require.False(t, inLegend(p), "%v in the legend %v", p, legend)
			}
		})
	}
}

// TestTheOperationsSitInTheLanesFrame: the operations' dots and labels,
// in as many rows as their labels need, lie inside the fault lanes'
// frame, below the lanes.
func TestTheOperationsSitInTheLanesFrame(t *testing.T) {
	t.Parallel()
	tl := Timeline{
		Windows:    []Window{{Kind: "pubsub_hang", From: 1, To: 5}, {Kind: "drain_kill", From: 2, To: 2}},
		Operations: []Marker{{Name: "replay", At: 10}, {Name: "replay done", At: 11}, {Name: "job_drain", At: 12}},
	}
	c := faultLanes(tl, laneKinds(tl.Windows), 60)
	addOperations(c, tl.Operations, 120, 900)
	f := frame{x0: 120, y0: 40, w: 900, h: c.frameHeight}
	lanesBottom := c.py(f, -0.5)
	var boxes []box
	for _, m := range c.marks {
		s := m.spots[0]
		at := XY{c.px(f, m.at.X) + s.dx, c.py(f, m.at.Y) + s.dy}
		b := textBox(m.text, at.X+s.tx, at.Y+s.ty, smallSize, s.anchor)
		b.x0 = at.X - 3
		b.y0 = min(b.y0, at.Y-3)
		require.GreaterOrEqual(t, b.y0, lanesBottom, "%q below the lanes", m.text)
		require.LessOrEqual(t, b.y1, f.y0+f.h, "%q inside the frame", m.text)
		require.False(t, overlapsAny(b, boxes), "%q overprints an operation", m.text)
		boxes = append(boxes, b)
	}
	require.Len(t, boxes, 3)
}
