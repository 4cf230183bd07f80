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

	"gonum.org/v1/plot/vg/vgsvg"
)

// XY is a point.
type XY struct{ X, Y float64 }

// palette colours the series and lanes.
var palette = []color.RGBA{{31, 119, 180, 255}, {214, 39, 40, 255}, {44, 160, 44, 255}, {255, 127, 14, 255},
	{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255}, {188, 189, 34, 255}, {23, 190, 207, 255}}

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
