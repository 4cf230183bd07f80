package sandbox

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLiveLineFitsTheTerminal: the live line is cut to the terminal's
// width, less one column, with "…".
func TestLiveLineFitsTheTerminal(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 265)
	require.Len(t, []rune(fit(long, 120)), 119)
	require.True(t, strings.HasSuffix(fit(long, 120), "…"))
	require.Equal(t, "short", fit("short", 120))
}

// TestTheLiveLineLeadsWithTheLags: the figures come first, the lags
// first among them, so that a narrow terminal cuts the phase, not them.
func TestTheLiveLineLeadsWithTheLags(t *testing.T) {
	t.Parallel()
	p := &Progress{phase: "waiting for verification", why: "12 events still to publish"}
	line := p.phaseLine("lags 0.3s / 1.2s · 5 commits")
	require.True(t, strings.HasPrefix(line, "lags 0.3s / 1.2s"), line)
	require.Equal(t, "lags 0.3s / 1.2s · 5 commits · waiting for verification (12 events still to publish)", line)
	require.Equal(t, "waiting for verification (12 events still to publish)", p.phaseLine(""))
}
