package plots

import (
	"encoding/xml"
	"fmt"
	"image/color"
	"os"
	"strings"
)

// The pictures are SVG written by hand: a chart here is a few lines,
// polygons, dots and texts, and a plotting library's SVG path links its
// PDF, EPS, LaTeX and raster back ends and their fonts as well (gonum's
// root package does, unless built with a tag a module cannot set).

// fontFamily names the fonts the texts are measured for, most likely
// first; textWidth's estimate is wide enough for the fallbacks.
const fontFamily = "Liberation Sans, Arial, Helvetica, sans-serif"

// Text sizes, in pixels.
const (
	titleSize = 14
	labelSize = 12
	smallSize = 11
)

// textWidth is an upper estimate of s's width at size: 0.6 of the size a
// character (Liberation Sans and Arial average about 0.5).
func textWidth(s string, size float64) float64 {
	return 0.6 * size * float64(len([]rune(s)))
}

// box is a rectangle in pixels, y down.
type box struct{ x0, y0, x1, y1 float64 }

// overlaps reports whether b and o share any area.
func (b box) overlaps(o box) bool {
	return b.x0 < o.x1 && o.x0 < b.x1 && b.y0 < o.y1 && o.y0 < b.y1
}

// textBox is the box of s drawn at size with its baseline at y, anchored
// at x ("start", "middle" or "end").
func textBox(s string, x, y, size float64, anchor string) box {
	w := textWidth(s, size)
	switch anchor {
	case "middle":
		x -= w / 2
	case "end":
		x -= w
	}
	return box{x, y - 0.8*size, x + w, y + 0.25*size}
}

// canvas collects a picture's SVG elements and the boxes of its texts.
type canvas struct {
	width, height float64
	body          strings.Builder
	texts         []box // every horizontal text's box, in drawing order
}

// hex is c as #rrggbb, its alpha ignored (opacity is written apart).
func hex(c color.RGBA) string { return fmt.Sprintf("#%02x%02x%02x", c.R, c.G, c.B) }

// polyline draws pts as a line of colour and width, dashed when dash is
// not empty ("4,3").
func (c *canvas) polyline(pts []XY, colour string, width float64, dash string) {
	if len(pts) == 0 {
		return
	}
	fmt.Fprintf(&c.body, `<polyline points="%s" style="fill:none;stroke:%s;stroke-width:%.2g`, points(pts), colour, width)
	if dash != "" {
		fmt.Fprintf(&c.body, ";stroke-dasharray:%s", dash)
	}
	c.body.WriteString("\"/>\n")
}

// polygon fills pts with colour at opacity (1: opaque).
func (c *canvas) polygon(pts []XY, colour string, opacity float64) {
	fmt.Fprintf(&c.body, `<polygon points="%s" style="fill:%s`, points(pts), colour)
	if opacity < 1 {
		fmt.Fprintf(&c.body, ";fill-opacity:%.2f", opacity)
	}
	c.body.WriteString("\"/>\n")
}

// dot draws a hollow circle at p.
func (c *canvas) dot(p XY, colour string) {
	fmt.Fprintf(&c.body, `<circle cx="%.1f" cy="%.1f" r="3" style="fill:white;stroke:%s;stroke-width:1"/>`+"\n", p.X, p.Y, colour)
}

// text draws s with its baseline at (x, y), anchored at x, and records its
// box.
func (c *canvas) text(s string, x, y, size float64, anchor string) {
	c.texts = append(c.texts, textBox(s, x, y, size, anchor))
	fmt.Fprintf(&c.body, `<text x="%.1f" y="%.1f" font-size="%g" text-anchor="%s">`, x, y, size, anchor)
	_ = xml.EscapeText(&c.body, []byte(s)) // a strings.Builder does not fail
	c.body.WriteString("</text>\n")
}

// vtext draws s turned a quarter left (a y axis's label), centred on
// (x, y).
func (c *canvas) vtext(s string, x, y, size float64) {
	fmt.Fprintf(&c.body, `<text x="%.1f" y="%.1f" font-size="%g" text-anchor="middle" transform="rotate(-90 %.1f %.1f)">`,
		x, y, size, x, y)
	_ = xml.EscapeText(&c.body, []byte(s))
	c.body.WriteString("</text>\n")
}

// points is pts as an SVG points attribute.
func points(pts []XY) string {
	var b strings.Builder
	for i, p := range pts {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.1f,%.1f", p.X, p.Y)
	}
	return b.String()
}

// svg is the whole picture.
func (c *canvas) svg() []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
		`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="%s">`+"\n",
		c.width, c.height, c.width, c.height, fontFamily)
	fmt.Fprintf(&b, `<rect width="%.0f" height="%.0f" style="fill:white"/>`+"\n", c.width, c.height)
	b.WriteString(c.body.String())
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// save writes the picture to path.
func (c *canvas) save(path string) error {
	if err := os.WriteFile(path, c.svg(), 0o644); err != nil {
		return fmt.Errorf("plots: write the picture: %w", err)
	}
	return nil
}
