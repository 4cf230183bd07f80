package plots

import (
	"cmp"
	"image/color"
	"math"
	"slices"
	"strconv"
	"strings"
)

// chart is one panel of a picture: series on two axes, translucent
// polygons behind them, vertical lines labelled above the frame, labels
// at data points placed where they overprint nothing, and a legend in
// headroom above the data.
type chart struct {
	title       string // lines apart by "\n"
	x, y        axis
	frameHeight float64 // pixels
	polygons    []filled
	series      []series
	moments     []Marker // dashed vertical lines, labelled above the frame
	marks       []mark
	// unlabelled are dashed vertical lines without labels (a picture's
	// moments in its lower panels).
	unlabelled []Marker
}

// axis is one axis of a chart: its label, its range (log: base 10) and,
// when not computed, its ticks.
type axis struct {
	label    string
	min, max float64
	log      bool
	ticks    []tick
}

// tick is a labelled position on an axis.
type tick struct {
	at    float64
	label string
}

// series is a line of a chart, named in its legend when name is set.
type series struct {
	name   string
	pts    []XY
	colour color.RGBA
	width  float64
	dash   string // "": solid
	dots   bool
}

// filled is a polygon in data coordinates.
type filled struct {
	pts     []XY
	colour  color.RGBA
	opacity float64
}

// mark is a text at a data point: drawn at the first of its spots where
// it overprints no text drawn before it, with a dot when dot is set.
type mark struct {
	at    XY
	text  string
	dot   *color.RGBA
	spots []spot
}

// spot is a place for a mark: its dot moved by (dx, dy) pixels, its text
// at (tx, ty) from the dot, anchored so.
type spot struct {
	dx, dy, tx, ty float64
	anchor         string
}

// besidePoint are the places for a point's label: right and above it,
// then the other corners, then above and below.
var besidePoint = []spot{
	{tx: 5, ty: -5, anchor: "start"}, {tx: 5, ty: 14, anchor: "start"},
	{tx: -5, ty: -5, anchor: "end"}, {tx: -5, ty: 14, anchor: "end"},
	{ty: -8, anchor: "middle"}, {ty: 18, anchor: "middle"},
	{tx: 5, ty: -17, anchor: "start"}, {tx: 5, ty: 26, anchor: "start"},
}

// frame is where a chart's data go, in pixels.
type frame struct{ x0, y0, w, h float64 }

// frac is v's place on a between its ends, 0 to 1.
func (a axis) frac(v float64) float64 {
	if a.log {
		v, lo, hi := math.Log10(max(v, 1e-12)), math.Log10(a.min), math.Log10(a.max)
		return (v - lo) / (hi - lo)
	}
	if a.max == a.min {
		return 0.5
	}
	return (v - a.min) / (a.max - a.min)
}

// legendHeight is the headroom c's legend takes above its data.
func (c *chart) legendHeight() float64 {
	n := 0
	for _, s := range c.series {
		if s.name != "" {
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return float64(n)*15 + 8
}

// px and py map a data point into f: the y axis's top below the legend.
func (c *chart) px(f frame, x float64) float64 { return f.x0 + c.x.frac(x)*f.w }
func (c *chart) py(f frame, y float64) float64 {
	return f.y0 + f.h - c.y.frac(y)*(f.h-c.legendHeight())
}

// titleLines are c's title's lines.
func (c *chart) titleLines() []string {
	if c.title == "" {
		return nil
	}
	return strings.Split(c.title, "\n")
}

// momentLabels are the boxes of c's moments' labels in rows above a
// frame at x0 of width w (row 0 nearest the frame), and the rows they
// take: a label starts right of its line, or ends left of it where it
// would pass the frame's right end.
func (c *chart) momentLabels(x0, w float64) (spans [][2]float64, rows []int, anchors []string) {
	for _, m := range c.moments {
		x := x0 + c.x.frac(m.At)*w
		tw := textWidth(m.Name, smallSize)
		from, anchor := x+3, "start"
		if x+3+tw > x0+w+20 {
			from, anchor = x-3-tw, "end"
		}
		spans = append(spans, [2]float64{from, from + tw})
		anchors = append(anchors, anchor)
	}
	return spans, labelRows(spans), anchors
}

// labelRows gives each span (pixels along a line) the first row where it
// starts a gap past the end of the row's last span, taking spans from the
// left: spans in one row never overlap.
func labelRows(spans [][2]float64) []int {
	const gap = 6
	order := make([]int, len(spans))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(spans[a][0], spans[b][0]) })
	var rowEnds []float64
	rows := make([]int, len(spans))
	for _, i := range order {
		row := slices.IndexFunc(rowEnds, func(e float64) bool { return spans[i][0] >= e+gap })
		if row < 0 {
			row = len(rowEnds)
			rowEnds = append(rowEnds, 0)
		}
		rowEnds[row] = spans[i][1]
		rows[i] = row
	}
	return rows
}

// rowCount is the number of rows rows take.
func rowCount(rows []int) int {
	n := 0
	for _, r := range rows {
		n = max(n, r+1)
	}
	return n
}

// niceTicks are round values between lo and hi, about six of them: a
// step of 1, 2 or 5 times a power of ten.
func niceTicks(lo, hi float64) []tick {
	if !(hi > lo) {
		return []tick{{lo, formatTick(lo, 1)}}
	}
	raw := (hi - lo) / 6
	pow := math.Pow(10, math.Floor(math.Log10(raw)))
	step := pow * 10
	for _, m := range []float64{1, 2, 5} {
		if raw <= m*pow {
			step = m * pow
			break
		}
	}
	var ticks []tick
	for v := math.Ceil(lo/step-1e-9) * step; v <= hi+step*1e-9; v += step {
		ticks = append(ticks, tick{v, formatTick(v, step)})
	}
	return ticks
}

// logTicks are the powers of ten between lo and hi, and their doubles
// and fives where the range spans less than three decades.
func logTicks(lo, hi float64) []tick {
	steps := []float64{1}
	if hi/lo < 1000 {
		steps = []float64{1, 2, 5}
	}
	var ticks []tick
	for e := math.Floor(math.Log10(lo)); e <= math.Log10(hi)+1e-9; e++ {
		for _, m := range steps {
			v := m * math.Pow(10, e)
			if v >= lo*(1-1e-9) && v <= hi*(1+1e-9) {
				ticks = append(ticks, tick{v, formatTick(v, math.Pow(10, e))})
			}
		}
	}
	return ticks
}

// formatTick writes v rounded to step's precision.
func formatTick(v, step float64) string {
	prec := max(0, -int(math.Floor(math.Log10(step)+1e-9)))
	if math.Abs(v) < step*1e-9 {
		v = 0
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

// widestTick is the width of a's widest tick label.
func (a axis) widestTick() float64 {
	widest := 0.0
	for _, t := range a.axisTicks() {
		widest = max(widest, textWidth(t.label, smallSize))
	}
	return widest
}

// axisTicks are a's ticks: its own, or computed from its range.
func (a axis) axisTicks() []tick {
	switch {
	case a.ticks != nil:
		return a.ticks
	case a.log:
		return logTicks(a.min, a.max)
	default:
		return niceTicks(a.min, a.max)
	}
}

// addLevel draws level as a horizontal dashed line across c, labelled
// above it at the left (below it where that is taken).
func addLevel(c *chart, level Marker) {
	c.series = append(c.series, series{pts: []XY{{X: c.x.min, Y: level.At}, {X: c.x.max, Y: level.At}}, colour: black, width: 1, dash: "4,3"})
	c.marks = append(c.marks, mark{at: XY{X: c.x.min, Y: level.At}, text: level.Name,
		spots: []spot{{tx: 4, ty: -4, anchor: "start"}, {tx: 4, ty: 13, anchor: "start"}}})
}
