package plots

// picture is charts one above the other on one width, their frames
// aligned on one left edge.
type picture struct {
	width  float64
	charts []*chart
}

// Layout, in pixels.
const (
	pictureWidth = 1100
	rightMargin  = 30
	tickLength   = 5
	rowHeight    = 14 // a row of moment labels
	belowFrame   = 56 // tick labels, the x axis's label and the gap to the next chart
)

// frameX is where every chart's frame starts and how wide it is: past
// the widest y tick label and the y axis's label.
func (p *picture) frameX() (x0, w float64) {
	widest := 0.0
	for _, c := range p.charts {
		widest = max(widest, c.y.widestTick())
	}
	x0 = 12 + labelSize + 8 + widest + tickLength + 4
	return x0, p.width - x0 - rightMargin
}

// above is the height over c's frame: its title and its moments' rows.
func (c *chart) above(x0, w float64) float64 {
	_, rows, _ := c.momentLabels(x0, w)
	return float64(len(c.titleLines()))*18 + float64(rowCount(rows))*rowHeight + 8
}

// draw lays the charts out and draws them.
func (p *picture) draw() *canvas {
	x0, w := p.frameX()
	height := 8.0
	above := make([]float64, len(p.charts))
	for i, c := range p.charts {
		above[i] = c.above(x0, w)
		height += above[i] + c.frameHeight + belowFrame
	}
	cv := &canvas{width: p.width, height: height}
	y := 8.0
	for i, c := range p.charts {
		y += above[i]
		c.draw(cv, frame{x0: x0, y0: y, w: w, h: c.frameHeight})
		y += c.frameHeight + belowFrame
	}
	return cv
}

// save draws the picture to path as SVG.
func (p *picture) save(path string) error { return p.draw().save(path) }

// draw draws c into f: what is behind first, the texts last, each
// mark's where it overprints no text before it.
func (c *chart) draw(cv *canvas, f frame) {
	for _, pg := range c.polygons {
		cv.polygon(c.mapped(f, pg.pts), hex(pg.colour), pg.opacity)
	}
	// An unlabelled moment's line ends at the data's top, under the
	// legend; a labelled one's at the frame's, under its label.
	for _, m := range c.unlabelled {
		x := c.px(f, m.At)
		cv.polyline([]XY{{x, f.y0 + f.h}, {x, c.py(f, c.y.max)}}, "black", 1, "4,3")
	}
	for _, m := range c.moments {
		x := c.px(f, m.At)
		cv.polyline([]XY{{x, f.y0 + f.h}, {x, f.y0}}, "black", 1, "4,3")
	}
	var blocked []box
	for _, s := range c.series {
		pts := c.mapped(f, s.pts)
		cv.polyline(pts, hex(s.colour), s.width, s.dash)
		if s.dots {
			for _, p := range pts {
				cv.dot(p, hex(s.colour))
				blocked = append(blocked, box{p.X - 3, p.Y - 3, p.X + 3, p.Y + 3})
			}
		}
	}
	c.drawAxes(cv, f)
	c.drawTitle(cv, f)
	blocked = append(blocked, c.drawLegend(cv, f))
	for _, m := range c.marks {
		c.drawMark(cv, f, m, blocked)
	}
}

// mapped is pts in f's pixels.
func (c *chart) mapped(f frame, pts []XY) []XY {
	out := make([]XY, len(pts))
	for i, p := range pts {
		out[i] = XY{c.px(f, p.X), c.py(f, p.Y)}
	}
	return out
}

// drawAxes draws the frame's left and bottom edges, their ticks, tick
// labels and labels.
func (c *chart) drawAxes(cv *canvas, f frame) {
	bottom := f.y0 + f.h
	cv.polyline([]XY{{f.x0, f.y0}, {f.x0, bottom}, {f.x0 + f.w, bottom}}, "black", 1, "")
	for _, t := range c.x.axisTicks() {
		if fr := c.x.frac(t.at); fr < -1e-9 || fr > 1+1e-9 {
			continue
		}
		x := c.px(f, t.at)
		cv.polyline([]XY{{x, bottom}, {x, bottom + tickLength}}, "black", 1, "")
		cv.text(t.label, x, bottom+tickLength+12, smallSize, "middle")
	}
	for _, t := range c.y.axisTicks() {
		if fr := c.y.frac(t.at); fr < -1e-9 || fr > 1+1e-9 {
			continue
		}
		y := c.py(f, t.at)
		cv.polyline([]XY{{f.x0 - tickLength, y}, {f.x0, y}}, "black", 1, "")
		cv.text(t.label, f.x0-tickLength-3, y+4, smallSize, "end")
	}
	if c.x.label != "" {
		cv.text(c.x.label, f.x0+f.w/2, bottom+tickLength+30, labelSize, "middle")
	}
	if c.y.label != "" { // beside this chart's widest tick label
		cv.vtext(c.y.label, f.x0-tickLength-3-c.y.widestTick()-8-labelSize/2, f.y0+f.h/2, labelSize)
	}
}

// drawTitle draws c's title over its moments' rows and its moments'
// labels in their rows over the frame.
func (c *chart) drawTitle(cv *canvas, f frame) {
	spans, rows, anchors := c.momentLabels(f.x0, f.w)
	lines := c.titleLines()
	y := f.y0 - 8 - float64(rowCount(rows))*rowHeight - float64(len(lines)-1)*18
	for i, l := range lines {
		cv.text(l, f.x0+f.w/2, y+float64(i)*18, titleSize, "middle")
	}
	for i, m := range c.moments {
		x := spans[i][0]
		if anchors[i] == "end" {
			x = spans[i][1]
		}
		cv.text(m.Name, x, f.y0-4-float64(rows[i])*rowHeight, smallSize, anchors[i])
	}
}

// drawLegend draws the named series' names and swatches in the headroom
// at the frame's top right, the names ending left of the swatches (a
// wider font than measured grows them away from the swatch), and returns
// the box it takes.
func (c *chart) drawLegend(cv *canvas, f frame) box {
	right := f.x0 + f.w
	b := box{right, f.y0, right, f.y0}
	i := 0
	for _, s := range c.series {
		if s.name == "" {
			continue
		}
		base := f.y0 + 14 + float64(i)*15
		cv.text(s.name, right-40, base, labelSize, "end")
		cv.polyline([]XY{{right - 34, base - 4}, {right - 6, base - 4}}, hex(s.colour), max(s.width, 1), s.dash)
		if s.dots {
			cv.dot(XY{right - 20, base - 4}, hex(s.colour))
		}
		tb := cv.texts[len(cv.texts)-1] // the name's box
		b = box{min(b.x0, tb.x0), min(b.y0, tb.y0), b.x1, max(b.y1, tb.y1, base)}
		i++
	}
	return b
}

// drawMark draws m at its first spot where its text and dot overprint
// no text drawn before and nothing blocked, inside the frame (its first
// spot when none is free).
func (c *chart) drawMark(cv *canvas, f frame, m mark, blocked []box) {
	at := XY{c.px(f, m.at.X), c.py(f, m.at.Y)}
	chosen := m.spots[0]
	for _, s := range m.spots {
		d := XY{at.X + s.dx, at.Y + s.dy}
		b := textBox(m.text, d.X+s.tx, d.Y+s.ty, smallSize, s.anchor)
		if b.x0 < f.x0 || b.x1 > f.x0+f.w+rightMargin-2 || b.y0 < f.y0-4 || b.y1 > f.y0+f.h {
			continue
		}
		if m.dot != nil {
			b.x0 = min(b.x0, d.X-3)
		}
		if !overlapsAny(b, cv.texts) && !overlapsAny(b, blocked) {
			chosen = s
			break
		}
	}
	d := XY{at.X + chosen.dx, at.Y + chosen.dy}
	if m.dot != nil {
		cv.dot(d, hex(*m.dot))
	}
	cv.text(m.text, d.X+chosen.tx, d.Y+chosen.ty, smallSize, chosen.anchor)
}

// overlapsAny reports whether b overlaps any of boxes.
func overlapsAny(b box, boxes []box) bool {
	for _, o := range boxes {
		if b.overlaps(o) {
			return true
		}
	}
	return false
}
