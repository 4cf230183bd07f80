package plots

// LabelRows is labelRows, for the tests.
var LabelRows = labelRows

// LaneKinds and LaneBar are laneKinds and laneBar, for the tests.
var (
	LaneKinds = laneKinds
	LaneBar   = laneBar
)

// Box and TextBox are box and textBox, for the tests.
type Box = box

// TextBox is textBox, for the tests.
var TextBox = textBox

// Overlaps is box.overlaps, for the tests.
func (b box) Overlaps(o box) bool { return b.overlaps(o) }

// X0 and X1 are b's left and right edges, for the tests.
func (b box) X0() float64 { return b.x0 }

// X1 is b's right edge, for the tests.
func (b box) X1() float64 { return b.x1 }
