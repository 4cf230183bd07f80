// Package await bounds a test's waits, so that what never comes fails the
// test naming what it waited for instead of hanging until the package's
// time-out (never deployed: see shared/testbench/deptest).
package await

import (
	"testing"
	"time"
)

// Bound is how long Receive waits.
const Bound = 2 * time.Minute

// Receive takes a value from ch within Bound, or fails the test naming what
// it waited for (a drain that never ends is a failure, not a hang).
func Receive[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(Bound):
		t.Fatalf("waited %v: %s", Bound, what)
		var zero T
		return zero
	}
}
