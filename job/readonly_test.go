package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestReadOnlyCommandsNeedNoPubSub: status, audit and set-aside run with no
// Pub/Sub credentials and no emulator (an operator's laptop with the
// job's database access only, or an account without publish rights); a
// command that publishes says that it could not open the publisher.
//
// Not parallel: the Google client libraries read the credentials' path
// from the process environment, which the test points at a missing file
// (so that nothing looks for credentials elsewhere, on the network).
func TestReadOnlyCommandsNeedNoPubSub(t *testing.T) {
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "none.json"))
	h := newHarness(t, &sdkfixture.V4Template)
	h.withWarehouse()
	h.start("w1")
	h.products("w1", 3)
	h.deliver()
	h.products("w1", 2)

	noPubSub := map[string]string{"PUBSUB_EMULATOR_HOST": ""}
	for _, args := range [][]string{{"status", "--workspace", "w1"}, {"status", "--json"}, {"audit", "--workspace", "w1", "--recheck-after", "50ms"},
		{"set-aside", "--workspace", "w1"}} {
		out, logs, err := h.runEnv(h.ctx, noPubSub, args...)
		require.NoError(t, err, "%v\n%s\n%s", args, out, logs)
	}
	out, _, _ := h.runEnv(h.ctx, noPubSub, "status", "--workspace", "w1")
	require.Contains(t, out, "dead letters not counted", "status says what it could not read")

	_, logs, err := h.runEnv(h.ctx, noPubSub, "drain", "--workspace", "w1")
	require.Error(t, err)
	require.Contains(t, err.Error()+logs, "open the Pub/Sub publisher")
}
