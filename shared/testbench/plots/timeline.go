package plots

import (
	"cmp"
	"image/color"
	"slices"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
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
	lanes, err := faultLanes(t, kinds, end)
	if err != nil {
		return err
	}
	plots := []*plot.Plot{lanes}
	for _, p := range t.Panels {
		pl, err := panel(p, t, kinds, end)
		if err != nil {
			return err
		}
		plots = append(plots, pl)
	}
	width, height := 30*vg.Centimeter, vg.Length(float64(len(kinds))*0.55+8+7*float64(len(t.Panels)))*vg.Centimeter
	c := vgsvg.New(width, height)
	dc := draw.New(c)
	rows := make([][]*plot.Plot, len(plots))
	for i, p := range plots {
		rows[i] = []*plot.Plot{p}
	}
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadTop: vg.Centimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter,
		PadRight: vg.Centimeter, PadY: 6 * vg.Millimeter}
	canvases := plot.Align(rows, tiles, dc)
	for i, p := range plots {
		p.Draw(canvases[i][0])
	}
	return save(path, c)
}

// faultLanes is the chart of the faults: a lane a kind, each window a bar,
// each event a tick, the operations as labelled dots.
func faultLanes(t Timeline, kinds []string, end float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = t.Title
	p.X.Min, p.X.Max = 0, end
	p.Y.Min, p.Y.Max = -1, float64(len(kinds))
	var ticks []plot.Tick
	for i, k := range kinds {
		ticks = append(ticks, plot.Tick{Value: float64(i), Label: k})
	}
	p.Y.Tick.Marker = plot.ConstantTicks(ticks)
	p.Y.Label.Text = "faults"
	for _, w := range t.Windows {
		i := slices.Index(kinds, w.Kind)
		bar, err := plotter.NewPolygon(laneBar(w, i, end))
		if err != nil {
			return nil, err
		}
		bar.Color = shade(i, 110)
		bar.LineStyle.Width = 0
		p.Add(bar)
	}
	if len(t.Operations) > 0 {
		pts := make(plotter.XYs, len(t.Operations))
		labels := make([]string, len(t.Operations))
		row := labelRows(t.Operations, end)
		for i, o := range t.Operations {
			// Below the lanes, a row further down for each label that
			// would overprint one before it.
			pts[i] = plotter.XY{X: o.At, Y: -1 - 0.9*float64(row[i])}
			labels[i] = o.Name
			p.Y.Min = min(p.Y.Min, pts[i].Y-0.6)
		}
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return nil, err
		}
		p.Add(sc)
		l, err := plotter.NewLabels(plotter.XYLabels{XYs: pts, Labels: labels})
		if err != nil {
			return nil, err
		}
		for i := range l.TextStyle {
			l.TextStyle[i].YAlign = text.YCenter // beside its dot, in its row
		}
		l.Offset = vg.Point{X: vg.Points(5)}
		p.Add(l)
	}
	return p, addMoments(p, t.Moments, p.Y.Min, float64(len(kinds)))
}

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
func laneBar(w Window, i int, end float64) plotter.XYs {
	to := max(w.To, w.From+end/300)
	lane := float64(i)
	return plotter.XYs{{X: w.From, Y: lane - 0.35}, {X: to, Y: lane - 0.35}, {X: to, Y: lane + 0.35}, {X: w.From, Y: lane + 0.35}}
}

// shade is lane i's colour at alpha a: a non-premultiplied colour, as the
// SVG back end writes a colour's components divided by its alpha (a
// premultiplied color.RGBA with components above its alpha is no colour).
func shade(i int, a uint8) color.NRGBA {
	c := palette[i%len(palette)]
	return color.NRGBA{R: c.R, G: c.G, B: c.B, A: a}
}

// legendRoom is the headroom a panel's legend takes above its data, a
// share of the data's height for each series it names.
const legendRoom = 0.12

// labelWidth is the share of the time axis a marker's label takes: a
// label closer than that to the one before it goes a row further.
const labelWidth = 1.0 / 5

// labelRows gives each marker the first row where its label starts past
// the end of the row's last label.
func labelRows(markers []Marker, end float64) []int {
	order := make([]int, len(markers))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(markers[a].At, markers[b].At) })
	var rowEnds []float64
	rows := make([]int, len(markers))
	for _, i := range order {
		row := slices.IndexFunc(rowEnds, func(e float64) bool { return markers[i].At >= e })
		if row < 0 {
			row = len(rowEnds)
			rowEnds = append(rowEnds, 0)
		}
		rowEnds[row] = markers[i].At + labelWidth*end
		rows[i] = row
	}
	return rows
}

// panel is one chart of series over time, the faults' windows shaded
// behind it in their lanes' colours.
func panel(pn Panel, t Timeline, kinds []string, end float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = pn.Title
	p.Y.Label.Text = pn.YLabel
	p.X.Label.Text = "seconds since the start"
	p.X.Min, p.X.Max = 0, end
	p.Legend.Top = true
	top := 1.0
	for _, s := range pn.Series {
		for _, pt := range s.Points {
			top = max(top, pt.Y)
		}
	}
	for _, w := range t.Windows {
		if w.To <= w.From {
			continue // an event: a tick in its lane, no span to shade
		}
		band, err := plotter.NewPolygon(plotter.XYs{{X: w.From, Y: 0}, {X: w.To, Y: 0}, {X: w.To, Y: top * 1.1}, {X: w.From, Y: top * 1.1}})
		if err != nil {
			return nil, err
		}
		band.Color = shade(slices.Index(kinds, w.Kind), 28)
		band.LineStyle.Width = 0
		p.Add(band)
	}
	for i, s := range pn.Series {
		pts := make(plotter.XYs, len(s.Points))
		for j, pt := range s.Points {
			pts[j] = plotter.XY{X: pt.X, Y: pt.Y}
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return nil, err
		}
		line.Color = palette[i%len(palette)]
		line.Width = vg.Points(1.2)
		p.Add(line)
		p.Legend.Add(s.Name, line)
	}
	// Headroom above the data, the bands and the moments' lines for the
	// legend, so that it overprints none of them.
	p.Y.Min, p.Y.Max = 0, top*1.1+top*legendRoom*float64(len(pn.Series))
	// The moments' lines without their labels, which the fault lanes
	// above carry: here they would overprint the legend.
	return p, addMarks(p, t.Moments, 0, top*1.1)
}

// addMarks draws each moment as an unlabelled vertical dashed line.
func addMarks(p *plot.Plot, moments []Marker, from, to float64) error {
	for _, m := range moments {
		line, err := plotter.NewLine(plotter.XYs{{X: m.At, Y: from}, {X: m.At, Y: to}})
		if err != nil {
			return err
		}
		line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		line.Color = color.Black
		p.Add(line)
	}
	return nil
}

// addMoments draws each moment as a labelled vertical dashed line, a
// label that would overprint the one before it a row lower.
func addMoments(p *plot.Plot, moments []Marker, from, to float64) error {
	if err := addMarks(p, moments, from, to); err != nil {
		return err
	}
	rows := labelRows(moments, p.X.Max)
	for i, m := range moments {
		at := to - float64(rows[i])*(to-from)*0.08
		l, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: m.At, Y: at}}, Labels: []string{m.Name}})
		if err != nil {
			return err
		}
		p.Add(l)
	}
	return nil
}
