package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/logbuf"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestChaosRun runs `go run ./job/chaos --duration 60s` and checks that every
// fault kind and operation happened and every proof held.
func TestChaosRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole local pipeline under faults")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	var stdout, stderr logbuf.Buffer
	plot := filepath.Join(t.TempDir(), "chaos.svg")
	err := runChaosCommand(ctx, []string{"--duration", "60s", "--seed", "7", "--json", "--timeout", "5m", "--plot", plot}, func(string) string { return "" }, &stdout, &stderr)
	var rep chaosReport
	require.NoError(t, json.Unmarshal([]byte(stdout.String()), &rep), "the report; stderr:\n%s", stderr.String())
	require.NoError(t, err, "report:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	require.EqualValues(t, 7, rep.Seed)
	require.Equal(t, 2, rep.Drains, "two drain instances by default")
	for _, kind := range append(faultKinds, opReplay, opPartialReplay, opJobDrain, opReplay+"_done", opPartialReplay+"_done", opJobDrain+"_done") {
		require.Positive(t, rep.Faults[kind], "%s happened", kind)
	}
	effective := 0
	for _, kind := range faultKinds {
		if rep.FaultsEffective[kind] > 0 {
			effective++
		}
	}
	// A 60 s run meets most kinds; a window the SDK's pause left empty is
	// reported as such (10-minute runs meet every kind).
	require.GreaterOrEqual(t, effective, len(faultKinds)*3/4, "faults that took effect: %v of %v", rep.FaultsEffective, rep.Faults)
	for _, e := range rep.Timeline {
		require.False(t, e.Failed, "%+v", e)
	}
	require.Positive(t, rep.Promise.Pauses, "the promise was checked at the SDK's pauses")
	require.Positive(t, rep.Path.ByWakeUps, "the wake-ups' drains published")
	require.Positive(t, rep.ClaimRaces.Sent, "the claim race sent wake-ups while a claim was held")
	require.Positive(t, rep.CommitsPerSecond)
	require.Positive(t, rep.Commits)
	require.True(t, rep.FullyVerified)
	require.Equal(t, rep.Events, rep.Verified)
	require.Positive(t, rep.DuplicatesReplays, "the replays sent events again")
	require.Equal(t, rep.Published-rep.Duplicates, int(rep.Events), "each event published, duplicates aside")
	names := map[string]bool{}
	for _, p := range rep.Proofs {
		require.True(t, p.OK, "%s: %s", p.Name, p.Detail)
		names[p.Name] = true
	}
	for _, want := range []string{"every promised commit published by a drain in flight", "the wake-up path delivered", "the claim race was run", "every captured event verified", "none accepted but never published", "none verified before it landed", "receipts agree with the delivery rows", "none lost",
		"the replay published its events again", "the partial_replay published its events again", "no set-aside event left",
		"views equal to the source, every column", "job audit equal", "every fault reported was injected", "every promise covered by the run it named"} {
		require.True(t, names[want], "proof %q in the report", want)
	}
	require.True(t, strings.Contains(stderr.String(), "chaos ") && strings.Contains(stderr.String(), faultDrainFreeze), "the timeline printed as it goes")
	svg, err := os.ReadFile(plot)
	require.NoError(t, err, "--plot wrote the timeline")
	for _, want := range append([]string{"<svg", "commits/s", "messages published/s", "delivery lag", "verification lag", "faults end"}, faultKinds...) {
		require.Contains(t, string(svg), want, "the plot names it")
	}
}

// TestChaosSchedule: a seed gives one schedule; every fault kind and
// operation is in a schedule of the shortest duration, whatever the seed;
// key rotations are spaced; the faults end before the duration.
func TestChaosSchedule(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{minChaos, 90 * time.Second, 10 * time.Minute} {
		t.Run(d.String(), func(t *testing.T) {
			for seed := uint64(1); seed <= 200; seed++ {
				steps := schedule(seed, d)
				require.Equal(t, steps, schedule(seed, d), "seed %d repeats", seed)
				kinds := map[string]int{}
				lastRotation := -rotationSpacing
				for _, s := range steps {
					kinds[s.Kind]++
					require.Less(t, s.At+s.For, d+5*time.Second, "seed %d: %+v", seed, s)
					if s.Kind == faultKeyRotation {
						require.GreaterOrEqual(t, s.At-lastRotation, rotationSpacing, "seed %d", seed)
						lastRotation = s.At
					}
				}
				for _, k := range append(faultKinds, opReplay, opPartialReplay, opJobDrain) {
					require.Positive(t, kinds[k], "seed %d, %v: %s scheduled", seed, d, k)
				}
			}
		})
	}
}

// TestChaosRetriesKeepTheRotationsSpaced: a fault that met nothing is
// tried again, but a key rotation never is: a second one 4 s after the
// first would break the schedule's spacing (rotationSpacing).
func TestChaosRetriesKeepTheRotationsSpaced(t *testing.T) {
	t.Parallel()
	for _, kind := range faultKinds {
		want := 3
		if kind == faultKeyRotation {
			want = 1
		}
		require.Equal(t, want, attemptsOf(kind), kind)
	}
}

// TestChaosFlags: the chaos flags' bounds.
func TestChaosFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--duration", "10s"}, {"--rate", "0"}, {"--rate", "900"}, {"--drains", "0"}, {"--drains", "9"},
		{"--writers", "0"}, {"--keep"}, {"--cloud-sql"}, {"extra"}} {
		_, err := parseFlags(args, nil)
		require.ErrorAs(t, err, new(sandbox.UsageError), "%v", args)
	}
	cfg, err := parseFlags(nil, nil)
	require.NoError(t, err)
	require.Equal(t, time.Minute, cfg.chaos.duration, "a minute by default")
	require.Equal(t, 16, cfg.sandbox.Writers)
	require.True(t, cfg.sandbox.Chaos)
	require.NotZero(t, cfg.chaos.seed, "a seed is chosen and printed")
}
