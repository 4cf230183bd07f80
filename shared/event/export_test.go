package event

// What only the tests use.

// Oversize reports whether an event whose JSON is jsonBytes long can never fit
// in a batch under the SDK's bound, even alone.
func Oversize(jsonBytes int) bool {
	return MessageBytes(jsonBytes)+BatchOverhead > MaxBatchBytes
}

// Len is the number of events counted.
func (b *SizeBound) Len() int { return b.events }

// skipValue moves past the value at s.i, checking it.
func (s *scanner) skipValue(depth int) error {
	var none *objectIndex // check only, index nothing
	return none.scan(s, depth)
}
