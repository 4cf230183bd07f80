package plots

import (
	"fmt"
	"slices"
)

// FleetRun is one run of the wake-up path over a fleet of workspace
// databases on one server (BenchmarkWakeUpsFleet): its size, how the
// drain reached the server, how the commits were spread, and its figures.
type FleetRun struct {
	Workspaces   int
	Pooled, Zipf bool
	// CPUShare is the drain's server CPU a commit ÷ the writers' own;
	// Sessions the server sessions opened a commit; AcceptedP99 commit →
	// accepted p99 in milliseconds.
	CPUShare, Sessions, AcceptedP99 float64
}

// The fleet's bars (issue 69's "done when", at 1,000 workspaces): the
// drain's CPU within 0.8× the writers', at most 0.05 sessions opened a
// commit, commit → accepted p99 within 250 ms.
const (
	fleetCPUBar      = 0.8
	fleetSessionsBar = 0.05
	fleetP99Bar      = 250
)

// SaveFleet draws runs to path as SVG: against the number of workspaces,
// the drain's CPU ÷ the writers', sessions opened a commit and commit →
// accepted p99, all on log axes, a line for each way (direct, pooled) and
// spread (uniform, Zipf), each chart with its bar.
func SaveFleet(path string, runs []FleetRun) error {
	return (&picture{width: pictureWidth, charts: fleetCharts(runs)}).save(path)
}

// fleetCharts are SaveFleet's three charts.
func fleetCharts(runs []FleetRun) []*chart {
	runs = slices.Clone(runs)
	slices.SortStableFunc(runs, func(a, b FleetRun) int { return a.Workspaces - b.Workspaces })
	most := 1
	for _, r := range runs {
		most = max(most, r.Workspaces)
	}
	x := axis{label: "workspace databases on the server (log)", min: 0.7, max: float64(most) * 1.5, log: true}
	cpu := fleetChart("the drain's database CPU a commit ÷ the SDK writers'", axis{label: "× the writers' (log)", min: 0.1, log: true}, x, runs,
		func(r FleetRun) float64 { return r.CPUShare }, Marker{Name: fmt.Sprintf("bar %g×", fleetCPUBar), At: fleetCPUBar})
	sessions := fleetChart("server sessions opened a commit", axis{label: "sessions a commit (log)", min: 0.001, log: true}, x, runs,
		func(r FleetRun) float64 { return r.Sessions }, Marker{Name: fmt.Sprintf("bar %g", fleetSessionsBar), At: fleetSessionsBar})
	p99 := fleetChart("commit → accepted p99", axis{label: "ms (log)", min: 10, log: true}, x, runs,
		func(r FleetRun) float64 { return r.AcceptedP99 }, Marker{Name: fmt.Sprintf("bar %d ms", fleetP99Bar), At: fleetP99Bar})
	cpu.frameHeight += cpu.legendHeight()
	// One legend, the first chart's: the others draw the same lines.
	for _, c := range []*chart{sessions, p99} {
		for i := range c.series {
			c.series[i].name = ""
		}
	}
	return []*chart{cpu, sessions, p99}
}

// fleetChart is value of runs against their size on y (its label, its
// minimum, whether log; a value under the minimum is drawn at it, as a 0
// on a log axis), a line for each way and spread, with bar as a labelled
// level.
func fleetChart(title string, y, x axis, runs []FleetRun, value func(FleetRun) float64, bar Marker) *chart {
	y.max = bar.At * 1.2
	c := &chart{title: title, x: x, y: y, frameHeight: 220}
	for i, way := range []struct {
		name         string
		pooled, zipf bool
	}{{"direct, uniform", false, false}, {"pooled, uniform", true, false}, {"direct, Zipf", false, true}, {"pooled, Zipf", true, true}} {
		s := series{name: way.name, colour: palette[i%2], width: 1.2, dots: true}
		if way.zipf {
			s.dash = "5,3"
		}
		for _, r := range runs {
			if r.Pooled == way.pooled && r.Zipf == way.zipf {
				s.pts = append(s.pts, XY{X: float64(r.Workspaces), Y: max(value(r), y.min)})
				c.y.max = max(c.y.max, value(r)*1.08)
			}
		}
		if len(s.pts) > 0 {
			c.series = append(c.series, s)
		}
	}
	if c.y.log { // a log axis's headroom: half a decade
		c.y.max *= 3
	}
	addLevel(c, bar)
	return c
}
