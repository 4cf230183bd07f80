package plots

import (
	"fmt"
	"sort"
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
	return (&picture{width: pictureWidth, charts: frontierCharts(pts, rate, gather)}).save(path)
}

// frontierCharts are the frontier's two charts: pts at rate by gather,
// and pts at gather by rate.
func frontierCharts(pts []FrontierPoint, rate, gather float64) []*chart {
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
	return []*chart{latencyChart(byGather, rate), costChart(byRate, gather)}
}

// frontierHeight is a frontier chart's frame height in pixels.
const frontierHeight = 320

// latencyChart is cost against latency by gather at one rate: the drain's
// and the floor's p50 and p99, each point labelled with its gather, with
// the SPEC's bars.
func latencyChart(byGather []FrontierPoint, rate float64) *chart {
	c := &chart{
		title: fmt.Sprintf("cost against latency, by gather, at %.0f commits/s\n%s", rate, frontierFloor),
		x: axis{label: "commit → accepted, ms", min: 0,
			max: 1.08 * maxOf(byGather, func(p FrontierPoint) float64 { return max(p.DrainP99, p.FloorP99, specP99MS) })},
		y: axis{label: "database CPU ms per commit", min: 0,
			max: 1.08 * maxOf(byGather, func(p FrontierPoint) float64 { return max(p.DrainMS, p.FloorMS, p.WritersMS*specCostShare, 0.01) })},
		frameHeight: frontierHeight,
		moments:     []Marker{{Name: fmt.Sprintf("SPEC bar: p99 %d ms", specP99MS), At: specP99MS}},
	}
	curves := []struct {
		name string
		x, y func(FrontierPoint) float64
	}{
		{"drain p99", func(p FrontierPoint) float64 { return p.DrainP99 }, func(p FrontierPoint) float64 { return p.DrainMS }},
		{"drain p50", func(p FrontierPoint) float64 { return p.DrainP50 }, func(p FrontierPoint) float64 { return p.DrainMS }},
		{"floor p99", func(p FrontierPoint) float64 { return p.FloorP99 }, func(p FrontierPoint) float64 { return p.FloorMS }},
		{"floor p50", func(p FrontierPoint) float64 { return p.FloorP50 }, func(p FrontierPoint) float64 { return p.FloorMS }},
	}
	for i, cv := range curves {
		s := series{name: cv.name, colour: palette[i%len(palette)], width: 1, dots: true}
		for _, p := range byGather {
			at := XY{X: cv.x(p), Y: cv.y(p)}
			s.pts = append(s.pts, at)
			c.marks = append(c.marks, mark{at: at, text: fmt.Sprintf("%.0f ms", p.GatherMS), spots: besidePoint})
		}
		if len(s.pts) > 0 {
			c.series = append(c.series, s)
		}
	}
	addCostBar(c, byGather, nil)
	return c
}

// costChart is cost against the commit rate at one gather, the drain's and
// the floor's, with the SPEC's cost bar.
func costChart(byRate []FrontierPoint, gather float64) *chart {
	// A log axis needs a positive range: the rates' own, widened, or
	// 1–1000 before any is measured.
	lo, hi := 1.0, 1000.0
	if len(byRate) > 0 {
		lo, hi = byRate[0].Rate/1.5, byRate[len(byRate)-1].Rate*1.5
	}
	c := &chart{
		title: fmt.Sprintf("cost against the commit rate, gather %.0f ms", gather),
		x:     axis{label: "commits per second (log)", min: lo, max: hi, log: true},
		y: axis{label: "database CPU ms per commit", min: 0,
			max: 1.08 * maxOf(byRate, func(p FrontierPoint) float64 { return max(p.DrainMS, p.FloorMS, p.WritersMS*specCostShare, 0.01) })},
		frameHeight: frontierHeight,
	}
	for i, cv := range []struct {
		name string
		y    func(FrontierPoint) float64
	}{{"drain", func(p FrontierPoint) float64 { return p.DrainMS }}, {"floor", func(p FrontierPoint) float64 { return p.FloorMS }}} {
		s := series{name: cv.name, colour: palette[2*i], width: 1, dots: true}
		for _, p := range byRate {
			s.pts = append(s.pts, XY{X: p.Rate, Y: cv.y(p)})
		}
		if len(s.pts) > 0 {
			c.series = append(c.series, s)
		}
	}
	addCostBar(c, byRate, func(p FrontierPoint) float64 { return p.Rate })
	return c
}

// addCostBar draws the SPEC's cost bar, 0.3× the writers' CPU a commit,
// as a dashed line: through the points that measured it at their x, or
// (x nil: points of one rate) level at their mean across the chart;
// nothing when none measured it.
func addCostBar(c *chart, pts []FrontierPoint, x func(FrontierPoint) float64) {
	var xys []XY
	sum, n := 0.0, 0
	for _, pt := range pts {
		if pt.WritersMS > 0 && x != nil {
			xys = append(xys, XY{X: x(pt), Y: pt.WritersMS * specCostShare})
		}
		if pt.WritersMS > 0 {
			sum += pt.WritersMS * specCostShare
			n++
		}
	}
	if n == 0 {
		return
	}
	if x == nil {
		mean := sum / float64(n)
		xys = []XY{{X: c.x.min, Y: mean}, {X: c.x.max, Y: mean}}
	}
	sort.SliceStable(xys, func(i, j int) bool { return xys[i].X < xys[j].X })
	c.series = append(c.series, series{name: frontierLegend, pts: xys, colour: palette[1], width: 1.2, dash: "6,3"})
}

// maxOf is the largest of f over pts (0 for none).
func maxOf(pts []FrontierPoint, f func(FrontierPoint) float64) float64 {
	m := 0.0
	for _, p := range pts {
		m = max(m, f(p))
	}
	return m
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
	answers := runsPanel("the wake-up's answer, as the SDK waits for it", names, []runCurve{
		{"p50", func(r AnswerRun) float64 { return r.AnswerP50 }},
		{"p99", func(r AnswerRun) float64 { return r.AnswerP99 }},
		{"max", func(r AnswerRun) float64 { return r.AnswerMax }},
	}, runs, []Marker{{Name: "the SDK's 5 s", At: 5000}, {Name: "p99 bar 20 ms", At: 20}})
	accepted := runsPanel("commit → accepted", names, []runCurve{
		{"p50", func(r AnswerRun) float64 { return r.AcceptedP50 }},
		{"p99", func(r AnswerRun) float64 { return r.AcceptedP99 }},
	}, runs, []Marker{{Name: "fast bar 100 ms", At: 100}, {Name: "slow bar 2.5 s", At: 2500}})
	return (&picture{width: pictureWidth, charts: []*chart{answers, accepted}}).save(path)
}

// runCurve is one figure of AnswerRun, drawn across the runs.
type runCurve struct {
	name  string
	value func(AnswerRun) float64
}

// runsPanel is a chart of curves across the runs (one x position a run)
// on a log y axis in milliseconds, with levels as horizontal dashed lines
// labelled above them.
func runsPanel(title string, names []string, curves []runCurve, runs []AnswerRun, levels []Marker) *chart {
	c := &chart{
		title:       title,
		x:           axis{min: -0.5, max: float64(len(runs)) - 0.5, ticks: []tick{}},
		y:           axis{label: "ms (log)", min: 0.1, max: 20000, log: true},
		frameHeight: frontierHeight,
	}
	for i, n := range names {
		c.x.ticks = append(c.x.ticks, tick{at: float64(i), label: n})
	}
	for i, cv := range curves {
		s := series{name: cv.name, colour: palette[i%len(palette)], width: 1, dots: true}
		for j, r := range runs {
			s.pts = append(s.pts, XY{X: float64(j), Y: max(cv.value(r), 0.1)})
			c.y.max = max(c.y.max, 2*cv.value(r))
		}
		c.series = append(c.series, s)
	}
	for _, l := range levels {
		addLevel(c, l)
	}
	return c
}
