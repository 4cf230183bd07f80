package plots

// LabelRows is labelRows, for the tests.
var LabelRows = labelRows

// LaneKinds and LaneBar are laneKinds and laneBar, for the tests.
var (
	LaneKinds = laneKinds
	LaneBar   = laneBar
)
