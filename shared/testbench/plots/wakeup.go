package plots

import (
	"fmt"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// FrontierPoint is one measured setting of the wake-up path: the drain's
// and the floor's database CPU per commit, and commit → accepted latency,
// at a gather (the floor's interval) and a commit rate.
type FrontierPoint struct {
	GatherMS, Rate                         float64
	DrainMS, FloorMS                       float64 // CPU per commit
	DrainP50, DrainP99, FloorP50, FloorP99 float64
	// WritersMS is the SDK writers' own CPU per commit (0: not measured),
	// which the SPEC's cost bar is a share of.
	WritersMS float64
}

// The SPEC's bars for the wake-up path (§4): commit → accepted p99 within
// 100 ms, and the drain's database CPU per commit within 0.3× the SDK
// writers' own.
const (
	specP99MS      = 100
	specCostShare  = 0.3
	frontierFloor  = "floor: the least SQL that can publish between claiming and accepting, every gather, on a warm connection"
	frontierLegend = "SPEC bar: 0.3× the writers' CPU"
)

// SaveFrontier draws the frontier to path as SVG: cost against p99 and p50
// latency by gather at one rate (the drain's and the floor's curves), and
// cost against the rate at one gather, each with the SPEC's bars (the cost
// bar where the writers' CPU was measured).
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
	latency, err := latencyChart(byGather, rate)
	if err != nil {
		return err
	}
	cost, err := costChart(byRate, gather)
	if err != nil {
		return err
	}
	return saveStacked(path, latency, cost)
}

// latencyChart is cost against latency by gather at one rate: the drain's
// and the floor's p50 and p99, with the SPEC's bars.
func latencyChart(byGather []FrontierPoint, rate float64) (*plot.Plot, error) {
	latency := plot.New()
	latency.Title.Text = fmt.Sprintf("cost against latency, by gather, at %.0f commits/s\n%s", rate, frontierFloor)
	latency.X.Label.Text = "commit → accepted, ms"
	latency.Y.Label.Text = "database CPU ms per commit"
	latency.Legend.Top = true
	latency.Legend.XOffs = -vg.Centimeter // the thumbnails inside the frame
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
			return nil, err
		}
	}
	if err := addCostBar(latency, byGather, nil, maxOf(byGather, func(p FrontierPoint) float64 { return max(p.DrainP99, p.FloorP99, specP99MS) })); err != nil {
		return nil, err
	}
	top := maxOf(byGather, func(p FrontierPoint) float64 { return max(p.DrainMS, p.FloorMS, p.WritersMS*specCostShare) }) * 1.1
	return latency, addMoments(latency, []Marker{{Name: fmt.Sprintf("SPEC bar: p99 %d ms", specP99MS), At: specP99MS}}, 0, top)
}

// costChart is cost against the commit rate at one gather, the drain's and
// the floor's, with the SPEC's cost bar.
func costChart(byRate []FrontierPoint, gather float64) (*plot.Plot, error) {
	cost := plot.New()
	cost.Title.Text = fmt.Sprintf("cost against the commit rate, gather %.0f ms", gather)
	cost.X.Label.Text = "commits per second"
	cost.Y.Label.Text = "database CPU ms per commit"
	cost.Legend.Top = true
	cost.Legend.XOffs = -vg.Centimeter
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
		}
		if err := addCurve(cost, c.name, xys, labels, i*2); err != nil {
			return nil, err
		}
	}
	return cost, addCostBar(cost, byRate, func(p FrontierPoint) float64 { return p.Rate }, 0)
}

// addCostBar draws the SPEC's cost bar, 0.3× the writers' CPU a commit,
// as a dashed line: through the points that measured it at their x, or
// (x nil: points of one rate) level at their mean from 0 to xMax; nothing
// when none measured it.
func addCostBar(p *plot.Plot, pts []FrontierPoint, x func(FrontierPoint) float64, xMax float64) error {
	var xys plotter.XYs
	sum, n := 0.0, 0
	for _, pt := range pts {
		if pt.WritersMS > 0 && x != nil {
			xys = append(xys, plotter.XY{X: x(pt), Y: pt.WritersMS * specCostShare})
		}
		if pt.WritersMS > 0 {
			sum += pt.WritersMS * specCostShare
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if x == nil {
		mean := sum / float64(n)
		xys = plotter.XYs{{X: 0, Y: mean}, {X: xMax, Y: mean}}
	}
	sort.SliceStable(xys, func(i, j int) bool { return xys[i].X < xys[j].X })
	line, err := plotter.NewLine(xys)
	if err != nil {
		return err
	}
	line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
	line.Color = palette[1]
	p.Add(line)
	p.Legend.Add(frontierLegend, line)
	return nil
}

// maxOf is the largest of f over pts (0 for none).
func maxOf(pts []FrontierPoint, f func(FrontierPoint) float64) float64 {
	m := 0.0
	for _, p := range pts {
		m = max(m, f(p))
	}
	return m
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
	return saveStacked(path, answers, accepted)
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
	// A decade and more of headroom above the highest level (10 s) for the
	// legend, so that it overprints no line.
	p.Y.Min, p.Y.Max = 0.1, 200000
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
		label.Offset = vg.Point{Y: vg.Points(3)} // above its line, not struck through
		p.Add(label)
	}
	return p, nil
}
