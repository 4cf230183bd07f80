package plots

// LabelRows is labelRows, for the tests.
var LabelRows = labelRows
