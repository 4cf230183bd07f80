package functions

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestServerConfigDefaults: the deployed server's bounds when the command
// line sets none. The stop's grace stays under Cloud Run's 10 s between
// SIGTERM and SIGKILL, and long enough for a wake-up's drain (2 s of
// batches, then their acknowledgement) to end.
func TestServerConfigDefaults(t *testing.T) {
	t.Parallel()
	c := ServerConfig{}.withDefaults()
	require.Equal(t, ServerConfig{ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
		ShutdownGrace: 8 * time.Second}, c)
	require.Less(t, c.ShutdownGrace, 10*time.Second, "Cloud Run kills the instance 10 s after SIGTERM")
	require.Greater(t, c.ShutdownGrace, 4*time.Second, "a drain in flight ends within its grace")
	set := ServerConfig{ShutdownGrace: 3 * time.Second}.withDefaults()
	require.Equal(t, 3*time.Second, set.ShutdownGrace, "an explicit value is kept")
}
