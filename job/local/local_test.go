package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/logbuf"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestLocalRun runs the whole pipeline on embedded parts with a small
// workload and checks the summary's invariants; then, kept running
// (--keep), it is operated as the printed lines say: the job's commands,
// built as the deployed binary, with the printed exports only.
func TestLocalRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole local pipeline")
	}
	t.Parallel()
	job := filepath.Join(t.TempDir(), "job")
	build := exec.Command("go", "build", "-o", job, "github.com/segmentstream/ontology-replication/job")
	built := make(chan error, 1)
	go func() {
		out, err := build.CombinedOutput()
		if err != nil {
			err = errors.New(string(out))
		}
		built <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	var stderr logbuf.Buffer
	out, w := io.Pipe()
	ended := make(chan error, 1)
	go func() {
		err := runLocal(ctx, []string{"--records", "300", "--writers", "3", "--json", "--keep", "--timeout", "150s"},
			func(string) string { return "" }, w, &stderr)
		_ = w.CloseWithError(err)
		ended <- err
	}()
	dec := json.NewDecoder(out)
	var sum summary
	require.NoError(t, dec.Decode(&sum), "the summary; logs:\n%s", stderr.String())
	lines := bufio.NewScanner(io.MultiReader(dec.Buffered(), out))
	lines.Buffer(nil, 1<<20)
	require.Equal(t, 300, sum.Commits)
	require.True(t, sum.FullyVerified, "every event verified")
	require.Equal(t, sum.EventsWritten, sum.Verified)
	require.Zero(t, sum.Pending)
	require.GreaterOrEqual(t, int64(sum.Published), sum.EventsWritten, "at least once")
	require.GreaterOrEqual(t, sum.Landed, sum.EventsWritten)
	require.Equal(t, sum.Landed-sum.DuplicatesAbsorbed, sum.EventsWritten, "each event landed, duplicates aside")
	require.Positive(t, sum.Replayed, "the replay in the middle sent events back")
	require.Positive(t, sum.OutagePublishes, "the injected outage refused publishes")
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

	// The sandbox: the printed export line, pasted.
	var exports []string
	for lines.Scan() {
		if m := regexp.MustCompile(`^\s*export REPLICATION_WORKSPACES='([^']*)' PUBSUB_EMULATOR_HOST=(\S+)$`).FindStringSubmatch(lines.Text()); m != nil {
			exports = []string{"REPLICATION_WORKSPACES=" + m[1], "PUBSUB_EMULATOR_HOST=" + m[2]}
			break
		}
	}
	require.NotNil(t, exports, "the export line is printed")
	go func() { _, _ = io.Copy(io.Discard, out) }()
	require.NoError(t, <-built)
	jobRun := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, job, args...)
		cmd.Env = append(os.Environ(), exports...)
		var stdout strings.Builder
		cmd.Stdout = &stdout
		var logs strings.Builder
		cmd.Stderr = &logs
		err := cmd.Run()
		if err != nil {
			err = errors.New(err.Error() + ": " + logs.String())
		}
		return stdout.String(), err
	}
	status := func() map[string]any {
		raw, err := jobRun("status", "--json")
		require.NoError(t, err)
		var all []map[string]any
		require.NoError(t, json.Unmarshal([]byte(raw), &all), raw)
		require.Len(t, all, 1)
		return all[0]
	}
	st := status()
	require.EqualValues(t, 1, st["dead_letters"], "job status counts the demo's dead letter: %v", st)
	require.Positive(t, st["oldest_dead_letter_age_seconds"])
	listed, err := jobRun("dead-letter")
	require.NoError(t, err)
	require.Contains(t, listed, "1 message, 1 event")
	discarded, err := jobRun("dead-letter", "--discard")
	require.NoError(t, err)
	require.Contains(t, discarded, "discarded 1 message")
	require.EqualValues(t, 0, status()["dead_letters"], "none left")

	replayed, err := jobRun("replay", "--entity", "customer", "--json")
	require.NoError(t, err)
	var rep struct {
		Workspaces []struct {
			Result struct {
				Rows    int `json:"rows"`
				Drained struct {
					Published int `json:"published"`
				} `json:"drained"`
			} `json:"result"`
		} `json:"workspaces"`
	}
	require.NoError(t, json.Unmarshal([]byte(replayed), &rep), replayed)
	require.Positive(t, rep.Workspaces[0].Result.Rows, "the customers went back to pending")
	require.Positive(t, rep.Workspaces[0].Result.Drained.Published, "the replay's own drain published what it sent back")
	require.LessOrEqual(t, rep.Workspaces[0].Result.Drained.Published, rep.Workspaces[0].Result.Rows, "and nothing else was pending")
	// Published again: by the replay's drain, or by the sandbox's verifier
	// (every 2 s) when its sweep took some of them first.
	deadline := time.Now().Add(time.Minute)
	for status()["pending"] != 0.0 {
		require.True(t, time.Now().Before(deadline), "the replayed events stay pending")
		time.Sleep(200 * time.Millisecond) // the sandbox's verifier sweeps every 2 s
	}
	_, err = jobRun("replay", "--records", "junk")
	require.ErrorContains(t, err, "the replay's selection holds no event: records junk", "a selection of nothing fails, naming it")
	audited, err := jobRun("audit")
	require.NoError(t, err, "the warehouse still equals the source (what is in flight is not judged)")
	require.Contains(t, audited, "equal")

	cancel()
	require.NoError(t, <-ended)
}

// TestLocalRunCloudSQL: with --cloud-sql every component reaches the
// database through the Cloud SQL connector and the stand-in (IAM login,
// private IP), and the report says so; the run is proven as any other.
func TestLocalRunCloudSQL(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole local pipeline")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	var stdout, stderr logbuf.Buffer
	err := runLocal(ctx, []string{"--cloud-sql", "--records", "200", "--writers", "3", "--json", "--timeout", "150s"},
		func(string) string { return "" }, &stdout, &stderr)
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	var sum summary
	require.NoError(t, json.Unmarshal([]byte(stdout.String()), &sum), stdout.String())
	require.Contains(t, sum.Database, "Cloud SQL", "the report says how the database was reached")
	require.Regexp(t, `[1-9]\d* ephemeral certificates?`, sum.Database, "the connector asked the stand-in's Admin API for certificates")
	require.Regexp(t, `[1-9]\d* logins?`, sum.Database)
	require.True(t, sum.FullyVerified, "every event verified")
	require.Equal(t, sum.EventsWritten, sum.Verified)
	require.NotNil(t, sum.Audit)
	require.True(t, sum.Audit.Equal, "the audit, through the connector too, finds nothing: %+v", sum.Audit)
}

// TestLocalRunPooled: with --pooled every component reaches the database
// through a PgBouncer in session mode, its registry entries pooled, and
// the run is proven as any other.
func TestLocalRunPooled(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole local pipeline")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	var stdout, stderr logbuf.Buffer
	err := runLocal(ctx, []string{"--pooled", "--records", "200", "--writers", "3", "--json", "--timeout", "150s"},
		func(string) string { return "" }, &stdout, &stderr)
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	var sum summary
	require.NoError(t, json.Unmarshal([]byte(stdout.String()), &sum), stdout.String())
	require.Contains(t, sum.Database, "PgBouncer", "the report says how the database was reached")
	require.True(t, sum.FullyVerified, "every event verified")
	require.Equal(t, sum.EventsWritten, sum.Verified)
	require.NotNil(t, sum.Audit)
	require.True(t, sum.Audit.Equal, "the audit, through the pooler too, finds nothing: %+v", sum.Audit)
}

// TestLocalUsage: stray arguments and bad flags are usage errors (the
// command exits 2), before anything starts.
func TestLocalUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"extra"}, {"--records", "5"}, {"--no-such-flag"}, {"--chaos", "1m"},
		{"--cloud-sql", "--keep"}, {"--pooled", "--cloud-sql"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			err := runLocal(context.Background(), args, func(string) string { return "" }, io.Discard, io.Discard)
			require.Error(t, err)
			require.True(t, errors.As(err, new(sandbox.UsageError)), "%v is a usage error", err)
			if args[0] == "--chaos" {
				require.ErrorContains(t, err, "go run ./job/chaos", "the old flag says where the chaos run went")
			}
		})
	}
}
