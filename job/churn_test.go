package main

import (
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestStatusShowsTheServersSessionChurn: `job status` shows the sessions
// the workspace's server opened a minute, as the server counts them
// (pg_stat_database), since its statistics were reset: the sessions opened
// after a reset show in the workspace's database and, at least as many, in
// the server's.
func TestStatusShowsTheServersSessionChurn(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	h.start("w1")
	s := h.spaces["w1"]
	_, err := s.pool.Exec(h.ctx, `SELECT pg_stat_reset()`)
	require.NoError(t, err)
	const opened = 3
	for range opened {
		conn, err := pgx.Connect(h.ctx, s.url)
		require.NoError(t, err)
		require.NoError(t, conn.Close(h.ctx))
	}
	var docs []workspaceStatus
	require.NoError(t, json.Unmarshal([]byte(h.mustRun("status", "--json")), &docs))
	require.Len(t, docs, 1)
	churn := docs[0].SessionsOpened
	require.NotNil(t, churn, "the statistics' reset time is known")
	require.Positive(t, churn.OverSeconds)
	require.GreaterOrEqual(t, churn.DatabasePerMinute*churn.OverSeconds/60, float64(opened)-0.01, "the sessions opened since the reset")
	require.GreaterOrEqual(t, churn.ServerPerMinute, churn.DatabasePerMinute)
}
