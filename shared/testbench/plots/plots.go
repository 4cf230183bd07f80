// Package plots draws the pictures the test bench shows: a chaos run's
// timeline (go run ./job/local --chaos … --plot FILE.svg), and the wake-up
// path's cost-latency frontier and its answers as the SDK waits for them
// (BenchmarkWakeUps with REPLICATION_WAKEUP_PLOT), as SVG, with gonum.org/v1/plot. It is never
// deployed.
package plots

import (
	"fmt"
	"image/color"
	"os"
	"slices"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// XY is a point.
type XY struct{ X, Y float64 }

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

// palette colours the series and lanes.
var palette = []color.RGBA{{31, 119, 180, 255}, {214, 39, 40, 255}, {44, 160, 44, 255}, {255, 127, 14, 255},
	{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255}, {188, 189, 34, 255}, {23, 190, 207, 255}}

// SaveTimeline draws t to path as SVG: the fault lanes on top, then each
// panel, all on one time axis, with the moments as vertical lines.
func SaveTimeline(path string, t Timeline) error {
	kinds := []string{}
	for _, w := range t.Windows {
		if !slices.Contains(kinds, w.Kind) {
			kinds = append(kinds, w.Kind)
		}
	}
	sort.Strings(kinds)
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
		pl, err := panel(p, t.Moments, end)
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
		to := max(w.To, w.From+end/300) // an event: a tick of a visible width
		bar, err := plotter.NewPolygon(plotter.XYs{{X: w.From, Y: float64(i) - 0.35}, {X: to, Y: float64(i) - 0.35},
			{X: to, Y: float64(i) + 0.35}, {X: w.From, Y: float64(i) + 0.35}})
		if err != nil {
			return nil, err
		}
		col := palette[i%len(palette)]
		bar.Color = color.RGBA{col.R, col.G, col.B, 110}
		bar.LineStyle.Width = 0
		p.Add(bar)
	}
	if len(t.Operations) > 0 {
		pts := make(plotter.XYs, len(t.Operations))
		labels := make([]string, len(t.Operations))
		for i, o := range t.Operations {
			pts[i] = plotter.XY{X: o.At, Y: -0.6}
			labels[i] = o.Name
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
		p.Add(l)
	}
	return p, addMoments(p, t.Moments, -1, float64(len(kinds)))
}

// panel is one chart of series over time.
func panel(pn Panel, moments []Marker, end float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = pn.Title
	p.Y.Label.Text = pn.YLabel
	p.X.Label.Text = "seconds since the start"
	p.X.Min, p.X.Max = 0, end
	p.Legend.Top = true
	top := 1.0
	for i, s := range pn.Series {
		pts := make(plotter.XYs, len(s.Points))
		for j, pt := range s.Points {
			pts[j] = plotter.XY{X: pt.X, Y: pt.Y}
			top = max(top, pt.Y)
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
	p.Y.Min, p.Y.Max = 0, top*1.1
	return p, addMoments(p, moments, 0, top*1.1)
}

// addMoments draws each moment as a labelled vertical dashed line.
func addMoments(p *plot.Plot, moments []Marker, from, to float64) error {
	for _, m := range moments {
		line, err := plotter.NewLine(plotter.XYs{{X: m.At, Y: from}, {X: m.At, Y: to}})
		if err != nil {
			return err
		}
		line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		line.Color = color.Black
		p.Add(line)
		l, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: m.At, Y: to}}, Labels: []string{m.Name}})
		if err != nil {
			return err
		}
		p.Add(l)
	}
	return nil
}

// FrontierPoint is one measured setting of the wake-up path: the drain's
// and the floor's database CPU per commit, and commit → accepted latency,
// at a gather (the floor's interval) and a commit rate.
type FrontierPoint struct {
	GatherMS, Rate                         float64
	DrainMS, FloorMS                       float64 // CPU per commit
	DrainP50, DrainP99, FloorP50, FloorP99 float64
}

// SaveFrontier draws the frontier to path as SVG: cost against p99 and p50
// latency by gather at one rate (the drain's and the floor's curves), and
// cost against the rate at one gather.
func SaveFrontier(path string, pts []FrontierPoint, rate, gather float64) error {
	var byGather, byRate []FrontierPoint
	for _, p := range pts {
		if p.Rate == rate {
			byGather = append(byGather, p)
		}
		if p.GatherMS == gather {
			byRate = append(byRate, p)
		}
	}
	sort.Slice(byGather, func(i, j int) bool { return byGather[i].GatherMS < byGather[j].GatherMS })
	sort.Slice(byRate, func(i, j int) bool { return byRate[i].Rate < byRate[j].Rate })
	latency := plot.New()
	latency.Title.Text = fmt.Sprintf("cost against latency, by gather, at %.0f commits/s", rate)
	latency.X.Label.Text = "commit → accepted, ms"
	latency.Y.Label.Text = "database CPU ms per commit"
	latency.Legend.Top = true
	curves := []struct {
		name string
		x    func(FrontierPoint) float64
		y    func(FrontierPoint) float64
	}{
		{"drain p99", func(p FrontierPoint) float64 { return p.DrainP99 }, func(p FrontierPoint) float64 { return p.DrainMS }},
		{"drain p50", func(p FrontierPoint) float64 { return p.DrainP50 }, func(p FrontierPoint) float64 { return p.DrainMS }},
		{"floor p99", func(p FrontierPoint) float64 { return p.FloorP99 }, func(p FrontierPoint) float64 { return p.FloorMS }},
		{"floor p50", func(p FrontierPoint) float64 { return p.FloorP50 }, func(p FrontierPoint) float64 { return p.FloorMS }},
	}
	for i, c := range curves {
		xys := make(plotter.XYs, len(byGather))
		labels := make([]string, len(byGather))
		for j, p := range byGather {
			xys[j] = plotter.XY{X: c.x(p), Y: c.y(p)}
			labels[j] = fmt.Sprintf("%.0f ms", p.GatherMS)
		}
		if err := addCurve(latency, c.name, xys, labels, i); err != nil {
			return err
		}
	}
	cost := plot.New()
	cost.Title.Text = fmt.Sprintf("cost against the commit rate, gather %.0f ms", gather)
	cost.X.Label.Text = "commits per second"
	cost.Y.Label.Text = "database CPU ms per commit"
	cost.Legend.Top = true
	cost.X.Scale = plot.LogScale{}
	cost.X.Tick.Marker = plot.LogTicks{Prec: -1}
	// A log axis needs a positive range: the rates' own, widened (one
	// rate alone would otherwise make gonum widen it to 0), or 1–1000
	// before any is measured.
	cost.X.Min, cost.X.Max = 1, 1000
	for i, p := range byRate {
		if i == 0 {
			cost.X.Min, cost.X.Max = p.Rate, p.Rate
		}
		cost.X.Min, cost.X.Max = min(cost.X.Min, p.Rate), max(cost.X.Max, p.Rate)
	}
	cost.X.Min, cost.X.Max = cost.X.Min/1.5, cost.X.Max*1.5
	for i, c := range []struct {
		name string
		y    func(FrontierPoint) float64
	}{{"drain", func(p FrontierPoint) float64 { return p.DrainMS }}, {"floor", func(p FrontierPoint) float64 { return p.FloorMS }}} {
		xys := make(plotter.XYs, len(byRate))
		labels := make([]string, len(byRate))
		for j, p := range byRate {
			xys[j] = plotter.XY{X: p.Rate, Y: c.y(p)}
			labels[j] = ""
		}
		if err := addCurve(cost, c.name, xys, labels, i*2); err != nil {
			return err
		}
	}
	c := vgsvg.New(30*vg.Centimeter, 24*vg.Centimeter)
	dc := draw.New(c)
	canvases := plot.Align([][]*plot.Plot{{latency}, {cost}}, draw.Tiles{Rows: 2, Cols: 1, PadTop: 5 * vg.Millimeter,
		PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 5 * vg.Millimeter, PadY: 8 * vg.Millimeter}, dc)
	latency.Draw(canvases[0][0])
	cost.Draw(canvases[1][0])
	return save(path, c)
}

// addCurve adds a line with points and labels to p.
func addCurve(p *plot.Plot, name string, xys plotter.XYs, labels []string, colour int) error {
	if len(xys) == 0 {
		return nil
	}
	line, points, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	line.Color, points.Color = palette[colour%len(palette)], palette[colour%len(palette)]
	p.Add(line, points)
	p.Legend.Add(name, line, points)
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
	if err != nil {
		return err
	}
	p.Add(l)
	return nil
}

func save(path string, c *vgsvg.Canvas) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plots: %w", err)
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("plots: write %s: %w", path, err)
	}
	return f.Close()
}

// AnswerRun is one run of the wake-up path as the SDK drives it: how long
// the SDK waited for the wake-ups' answers and how long a commit took to
// be accepted (milliseconds), and the writers' achieved rate, under a
// label ("before, Pub/Sub fast").
type AnswerRun struct {
	Label                              string
	AnswerP50, AnswerP99, AnswerMax    float64
	AcceptedP50, AcceptedP99, Achieved float64
}

// SaveAnswers draws runs to path as SVG: per run, the wake-up answer's
// p50, p99 and max, and commit → accepted p50 and p99, on log axes (the
// SDK's 5 s and the SPEC's bars drawn as dashed lines).
func SaveAnswers(path string, runs []AnswerRun) error {
	names := make([]string, len(runs))
	for i, r := range runs {
		names[i] = fmt.Sprintf("%s (%.0f/s)", r.Label, r.Achieved)
	}
	answers, err := runsPanel("the wake-up's answer, as the SDK waits for it", names, []runCurve{
		{"p50", func(r AnswerRun) float64 { return r.AnswerP50 }},
		{"p99", func(r AnswerRun) float64 { return r.AnswerP99 }},
		{"max", func(r AnswerRun) float64 { return r.AnswerMax }},
	}, runs, []Marker{{Name: "the SDK's 5 s", At: 5000}, {Name: "p99 bar 20 ms", At: 20}})
	if err != nil {
		return err
	}
	accepted, err := runsPanel("commit → accepted", names, []runCurve{
		{"p50", func(r AnswerRun) float64 { return r.AcceptedP50 }},
		{"p99", func(r AnswerRun) float64 { return r.AcceptedP99 }},
	}, runs, []Marker{{Name: "fast bar 100 ms", At: 100}, {Name: "slow bar 2.5 s", At: 2500}})
	if err != nil {
		return err
	}
	c := vgsvg.New(30*vg.Centimeter, 24*vg.Centimeter)
	dc := draw.New(c)
	canvases := plot.Align([][]*plot.Plot{{answers}, {accepted}}, draw.Tiles{Rows: 2, Cols: 1, PadTop: 5 * vg.Millimeter,
		PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 5 * vg.Millimeter, PadY: 8 * vg.Millimeter}, dc)
	answers.Draw(canvases[0][0])
	accepted.Draw(canvases[1][0])
	return save(path, c)
}

// runCurve is one figure of AnswerRun, drawn across the runs.
type runCurve struct {
	name  string
	value func(AnswerRun) float64
}

// runsPanel is a chart of curves across the runs (one x position a run)
// on a log y axis in milliseconds, with levels as horizontal dashed lines.
func runsPanel(title string, names []string, curves []runCurve, runs []AnswerRun, levels []Marker) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "ms (log)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	p.NominalX(names...)
	p.Y.Min, p.Y.Max = 0.1, 10000
	for i, c := range curves {
		xys := make(plotter.XYs, len(runs))
		for j, r := range runs {
			xys[j] = plotter.XY{X: float64(j), Y: max(c.value(r), 0.1)}
		}
		if err := addCurve(p, c.name, xys, make([]string, len(runs)), i); err != nil {
			return nil, err
		}
	}
	for _, l := range levels {
		line, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: l.At}, {X: float64(len(runs)) - 0.5, Y: l.At}})
		if err != nil {
			return nil, err
		}
		line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(line)
		label, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: -0.5, Y: l.At}}, Labels: []string{l.Name}})
		if err != nil {
			return nil, err
		}
		p.Add(label)
	}
	return p, nil
}
