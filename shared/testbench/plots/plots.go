// Package plots draws the pictures the test bench shows: a chaos run's
// timeline (go run ./job/chaos --plot FILE.svg), and the wake-up
// path's cost-latency frontier and its answers as the SDK waits for them
// (BenchmarkWakeUps with REPLICATION_WAKEUP_PLOT), as SVG, with gonum.org/v1/plot. It is never
// deployed.
package plots

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// XY is a point.
type XY struct{ X, Y float64 }

// palette colours the series and lanes.
var palette = []color.RGBA{{31, 119, 180, 255}, {214, 39, 40, 255}, {44, 160, 44, 255}, {255, 127, 14, 255},
	{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255}, {188, 189, 34, 255}, {23, 190, 207, 255}}

// saveStacked draws two charts one above the other, their axes aligned,
// and writes them to path as SVG.
func saveStacked(path string, top, bottom *plot.Plot) error {
	c := vgsvg.New(30*vg.Centimeter, 24*vg.Centimeter)
	canvases := plot.Align([][]*plot.Plot{{top}, {bottom}}, draw.Tiles{Rows: 2, Cols: 1, PadTop: 5 * vg.Millimeter,
		PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 5 * vg.Millimeter, PadY: 8 * vg.Millimeter}, draw.New(c))
	top.Draw(canvases[0][0])
	bottom.Draw(canvases[1][0])
	return save(path, c)
}

// save writes a drawn canvas to path as SVG.
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
