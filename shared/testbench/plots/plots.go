// Package plots draws the pictures the test bench shows: a chaos run's
// timeline (go run ./job/chaos --plot FILE.svg), the wake-up path's
// cost-latency frontier and its answers as the SDK waits for them
// (BenchmarkWakeUps with REPLICATION_WAKEUP_PLOT), and the fleet's cost
// against its size (BenchmarkWakeUpsFleet with REPLICATION_FLEET_PLOT), as
// SVG written by hand (svg.go says why). It is never deployed.
package plots

import "image/color"

// XY is a point.
type XY struct{ X, Y float64 }

// palette colours the series and lanes.
var palette = []color.RGBA{{31, 119, 180, 255}, {214, 39, 40, 255}, {44, 160, 44, 255}, {255, 127, 14, 255},
	{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255}, {188, 189, 34, 255}, {23, 190, 207, 255}}
