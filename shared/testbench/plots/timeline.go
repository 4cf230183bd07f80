package plots

import (
	"image/color"
	"slices"
	"sort"
)

// Series is a named line of a panel.
type Series struct {
	Name   string
	Points []XY
}

// Panel is one chart of a timeline: its series over time, with a label
// for its y axis.
type Panel struct {
	Title, YLabel string
	Series        []Series
}

// Window is a fault's span (From == To: an event, drawn as a tick).
type Window struct {
	Kind     string
	From, To float64
}

// Marker is a moment worth a vertical line (the faults' end, full
// verification) or an operation (a replay's start and end).
type Marker struct {
	Name string
	At   float64
}

// Timeline is a run over time: its panels, its faults' windows (one lane a
// kind, above the panels), its operations and its marked moments; seconds
// since its start.
type Timeline struct {
	Title      string
	Panels     []Panel
	Windows    []Window
	Operations []Marker
	Moments    []Marker
}

// SaveTimeline draws t to path as SVG: the fault lanes on top, then each
// panel, all on one time axis, with the moments as vertical lines.
func SaveTimeline(path string, t Timeline) error {
	kinds := laneKinds(t.Windows)
	end := 0.0
	for _, p := range t.Panels {
		for _, s := range p.Series {
			for _, pt := range s.Points {
				end = max(end, pt.X)
			}
		}
	}
	for _, m := range t.Moments {
		end = max(end, m.At)
	}
	lanes := faultLanes(t, kinds, end)
	pic := &picture{width: pictureWidth, charts: []*chart{lanes}}
	for _, p := range t.Panels {
		pic.charts = append(pic.charts, panel(p, t, kinds, end))
	}
	x0, w := pic.frameX()
	addOperations(lanes, t.Operations, x0, w)
	return pic.save(path)
}

// laneHeight is a fault lane's height in pixels.
const laneHeight = 16

// faultLanes is the chart of the faults: a lane a kind, each window a bar,
// each event a tick, the moments labelled above.
func faultLanes(t Timeline, kinds []string, end float64) *chart {
	c := &chart{
		title:   t.Title,
		x:       axis{min: 0, max: end},
		y:       axis{label: "faults", min: -0.6, max: float64(len(kinds)) - 0.4, ticks: []tick{}},
		moments: t.Moments,
	}
	for i, k := range kinds {
		c.y.ticks = append(c.y.ticks, tick{at: float64(i), label: k})
	}
	for _, w := range t.Windows {
		i := slices.Index(kinds, w.Kind)
		c.polygons = append(c.polygons, filled{pts: laneBar(w, i, end), colour: palette[i%len(palette)], opacity: 0.45})
	}
	c.frameHeight = (c.y.max - c.y.min) * laneHeight
	return c
}

// addOperations puts the operations under c's lanes as labelled dots, a
// row further down for each label that would overprint one before it in
// a frame at x0 of width w, and makes room for them.
func addOperations(c *chart, ops []Marker, x0, w float64) {
	if len(ops) == 0 {
		return
	}
	spans := make([][2]float64, len(ops))
	for i, o := range ops {
		x := x0 + c.x.frac(o.At)*w
		spans[i] = [2]float64{x - 3, x + 6 + textWidth(o.Name, smallSize)}
	}
	rows := labelRows(spans)
	const rowStep = 0.9 // of a lane
	for i, o := range ops {
		c.marks = append(c.marks, mark{at: XY{X: o.At, Y: -1 - rowStep*float64(rows[i])}, text: o.Name, dot: &black,
			spots: []spot{{tx: 6, ty: 4, anchor: "start"}}})
	}
	c.y.min = -1 - rowStep*float64(rowCount(rows)-1) - 0.6
	c.frameHeight = (c.y.max - c.y.min) * laneHeight
}

// black is the operations' dots' colour.
var black = color.RGBA{A: 255}

// laneKinds are the windows' kinds, sorted: lane i is kinds[i]'s.
func laneKinds(windows []Window) []string {
	kinds := []string{}
	for _, w := range windows {
		if !slices.Contains(kinds, w.Kind) {
			kinds = append(kinds, w.Kind)
		}
	}
	sort.Strings(kinds)
	return kinds
}

// laneBar is window w's bar in lane i of a time axis ending at end: from
// its start to its end, 0.7 of the lane high; an event (of no length) a
// tick of a visible width.
func laneBar(w Window, i int, end float64) []XY {
	to := max(w.To, w.From+end/300)
	lane := float64(i)
	return []XY{{X: w.From, Y: lane - 0.35}, {X: to, Y: lane - 0.35}, {X: to, Y: lane + 0.35}, {X: w.From, Y: lane + 0.35}}
}

// panelHeight is a timeline panel's frame height in pixels.
const panelHeight = 240

// panel is one chart of series over time, the faults' windows shaded
// behind it in their lanes' colours, the moments as unlabelled lines (the
// fault lanes above carry their labels).
func panel(pn Panel, t Timeline, kinds []string, end float64) *chart {
	top := 1.0
	for _, s := range pn.Series {
		for _, pt := range s.Points {
			top = max(top, pt.Y)
		}
	}
	c := &chart{
		title:       pn.Title,
		x:           axis{label: "seconds since the start", min: 0, max: end},
		y:           axis{label: pn.YLabel, min: 0, max: top * 1.05},
		frameHeight: panelHeight,
		unlabelled:  t.Moments,
	}
	for _, w := range t.Windows {
		if w.To <= w.From {
			continue // an event: a tick in its lane, no span to shade
		}
		c.polygons = append(c.polygons, filled{pts: []XY{{X: w.From, Y: 0}, {X: w.To, Y: 0}, {X: w.To, Y: c.y.max}, {X: w.From, Y: c.y.max}},
			colour: palette[slices.Index(kinds, w.Kind)%len(palette)], opacity: 0.11})
	}
	for i, s := range pn.Series {
		c.series = append(c.series, series{name: s.Name, pts: s.Points, colour: palette[i%len(palette)], width: 1.2})
	}
	return c
}
