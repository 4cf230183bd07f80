package delivery

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLocalTurnTellsBusyFromQuiet: a workspace whose wake-ups reach this
// process once a second is quiet; a burst of one every 10 ms makes it busy
// within half a dozen wake-ups, and a pause of a second or more makes it quiet
// again at once.
func TestLocalTurnTellsBusyFromQuiet(t *testing.T) {
	l := &localTurn{}
	require.GreaterOrEqual(t, l.interval(), DefaultQuietInterval, "no wake-up yet: quiet")
	at := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	for range 5 {
		at = at.Add(time.Second)
		l.arrived(at)
	}
	require.GreaterOrEqual(t, l.interval(), DefaultQuietInterval, "a wake-up a second: quiet")
	burst := func(what string) {
		t.Helper()
		n := 0
		for l.interval() >= DefaultQuietInterval {
			require.Less(t, n, 100, "%s: never busy", what)
			at = at.Add(10 * time.Millisecond)
			l.arrived(at)
			n++
		}
		require.LessOrEqual(t, n, 6, "%s: a burst is busy within half a dozen wake-ups", what)
	}
	burst("after wake-ups a second apart")
	at = at.Add(10 * time.Second)
	l.arrived(at)
	require.GreaterOrEqual(t, l.interval(), DefaultQuietInterval, "quiet again after a pause")
	// A pause counts as maxInterval at most: after an hour's silence a
	// burst is busy as soon as after a second's.
	at = at.Add(time.Hour)
	l.arrived(at)
	burst("after an hour's silence")
}
