package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
)

// TestLocalRun runs the whole pipeline on embedded parts with a small
// workload and checks the summary's invariants.
func TestMain(m *testing.M) { pgtest.Main(m) }

func TestLocalRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole local pipeline")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := runLocal(ctx, []string{"--records", "300", "--writers", "3", "--json", "--timeout", "150s"},
		func(string) string { return "" }, &stdout, &stderr)
	require.NoError(t, err, "logs:\n%s", stderr.String())
	var sum summary
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &sum), stdout.String())

	require.Equal(t, 300, sum.Commits)
	require.True(t, sum.FullyVerified, "every event verified")
	require.Equal(t, sum.EventsWritten, sum.Verified)
	require.Zero(t, sum.Pending)
	require.GreaterOrEqual(t, int64(sum.Published), sum.EventsWritten, "at least once")
	require.GreaterOrEqual(t, sum.Landed, sum.EventsWritten)
	require.Equal(t, sum.Landed-sum.DuplicatesAbsorbed, sum.EventsWritten, "each event landed, duplicates aside")
	require.Positive(t, sum.Replayed, "the replay in the middle sent events back")
	require.Positive(t, sum.OutageRefusals, "the injected outage refused wake-ups")
	require.EqualValues(t, 1, sum.DeadLettered)
	require.True(t, sum.DeadLetterVerified, "the dropped message was retried and verified")
	require.Positive(t, sum.Requeued)
	require.Positive(t, sum.MaxVerificationLagSecs, "the summary ends with the lags")
	require.Less(t, sum.MaxVerificationLagSecs, 15*60.0, "not the dead-lettered event's staged 16 minutes")

	// In a pipe, a line per phase, in order, on stderr.
	var phases []string
	for _, line := range strings.Split(stderr.String(), "\n") {
		if rest, ok := strings.CutPrefix(line, "local: "); ok {
			phase, _, _ := strings.Cut(rest, " (")
			if len(phases) == 0 || phases[len(phases)-1] != phase {
				phases = append(phases, phase)
			}
		}
	}
	require.Equal(t, []string{"starting PostgreSQL, Pub/Sub, the local warehouse and the functions", "workload",
		"waiting for verification", "checking the views against the source tables", "auditing the warehouse against the source", "done"}, phases, stderr.String())
	require.Len(t, sum.Views, 4)
	for _, v := range sum.Views {
		require.True(t, v.Match, "view %s: %d rows, source %d, %d differing (%s)", v.View, v.Rows, v.Source, v.Differing, v.Example)
		require.Equal(t, v.Source, v.Rows)
		require.Zero(t, v.Differing, "every column of every record as the source's")
	}
	require.NotNil(t, sum.Audit)
	require.True(t, sum.Audit.Equal, "the audit finds nothing: %+v", sum.Audit)
	require.Zero(t, sum.Audit.InFlight, "everything verified before the audit")
	require.Positive(t, sum.Audit.Buckets)
}
