package functions

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
)

// fleet starts a cluster of the test's own, with max_connections as given,
// and a harness of n workspaces w001… on it, each with events of its own
// drained and accepted. The test's own connections are closed afterwards,
// so that the cluster's bound is the product's.
func fleet(t *testing.T, n, events, maxConnections int, opts ...option_) *harness {
	t.Helper()
	return fleetOn(t, map[string]string{"max_connections": fmt.Sprint(maxConnections)}, n, events, opts...)
}

// fleetOn is fleet on a server started with settings.
func fleetOn(t *testing.T, settings map[string]string, n, events int, opts ...option_) *harness {
	t.Helper()
	c, err := pgtest.Start(context.Background(), pgtest.Config{Disposable: true, Settings: settings})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("w%03d", i+1)
	}
	h := newHarness(t, append([]option_{withCluster(c), withWorkspaces(ids...)}, opts...)...)
	h.cluster = c
	for _, id := range ids {
		h.products(id, events)
		h.drainAll(id)
		h.spaces[id].pool.Reset()
	}
	return h
}

// slowly answers lookups as the events Pub/Sub holds, after latency (a
// realistic jobs.query latency is 1–2 s), counting them.
func (h *harness) slowly(latency time.Duration, lookups *atomic.Int64) {
	h.answerCtx(func(ctx context.Context, q bqserver.Query) (bqserver.Result, error) {
		lookups.Add(1)
		select {
		case <-time.After(latency):
			return h.landed(q)
		case <-ctx.Done():
			return bqserver.Result{}, ctx.Err()
		}
	})
}

// verifiedIn counts a workspace's verified events, with a connection
// closed afterwards.
func (h *harness) verifiedIn(id string) int64 {
	defer h.spaces[id].pool.Reset()
	return h.count(id, "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NOT NULL")
}

// TestVerifyFortyWorkspacesWithSlowBigQuery: 40 workspaces on one
// PostgreSQL, BigQuery answering after 2 s: one pass verifies every event
// of every workspace, looking them up side by side. No lookup is answered
// until eight are in flight at once (a lookup holds no connection, so even
// the workers waiting for one of the server's eight cannot hold the others
// back): a pass that looked its workspaces up one after another would never
// get an answer, whatever the machine's speed. The budget is generous, so
// that a busy machine's slowness is not what is tested.
func TestVerifyFortyWorkspacesWithSlowBigQuery(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server of its own with 40 databases")
	}
	t.Parallel()
	h := fleet(t, 40, 25, 100, withEnv(EnvVerifyBudget, "10m"), withEnv(EnvSweepBatches, "0"), withLookupTimeout(2*time.Minute))
	const together = 8
	var lookups, inFlight atomic.Int64
	sideBySide, oneByOne := make(chan struct{}), make(chan struct{})
	var reached, gaveUp sync.Once
	// An answer the client does not retry: the pass ends at once.
	oneAfterAnother := &bqserver.Error{Status: http.StatusBadRequest, Reason: "invalidQuery", Message: "lookups one after another"}
	h.answerCtx(func(ctx context.Context, q bqserver.Query) (bqserver.Result, error) {
		lookups.Add(1)
		if inFlight.Add(1) >= together {
			reached.Do(func() { close(sideBySide) })
		}
		defer inFlight.Add(-1)
		select {
		case <-sideBySide:
		case <-oneByOne:
			return bqserver.Result{}, oneAfterAnother
		case <-time.After(time.Minute): // ages, even on a busy machine
			gaveUp.Do(func() { close(oneByOne) })
			return bqserver.Result{}, oneAfterAnother
		case <-ctx.Done():
			return bqserver.Result{}, ctx.Err()
		}
		select {
		case <-time.After(2 * time.Second):
			return h.landed(q)
		case <-ctx.Done():
			return bqserver.Result{}, ctx.Err()
		}
	})
	stop := h.cluster.WatchClientConnections(t)
	code, pass := h.verify("")
	peak := stop()
	select {
	case <-sideBySide:
	default:
		t.Fatalf("never %d lookups in flight at once", together)
	}
	require.Equal(t, http.StatusOK, code, pass)
	require.Len(t, pass.Workspaces, 40)
	require.Empty(t, pass.NotReached)
	for _, r := range pass.Workspaces {
		require.Equal(t, delivery.OutcomeVerified, r.Outcome, r)
		require.Equal(t, 25, r.Verified, r.Workspace)
		require.EqualValues(t, 25, h.verifiedIn(r.Workspace), r.Workspace)
	}
	require.EqualValues(t, 40, lookups.Load(), "one lookup per workspace (each its own table)")
	require.Equal(t, 40, pass.Lookups)
	t.Logf("peak connections: %d", peak)
	require.LessOrEqual(t, peak, int64(defaultMaxOpenPools*defaultPoolSize))
}

// requireTimedOutAtMost: a pass of TestVerifyReportsWorkspacesNotReached
// answers 200, or, when BigQuery (300 ms a lookup) answered none of its
// lookups within the 1 s budget on a busy machine, 500: a pass that did no
// work is a failed pass, and none of its workspaces completed a round.
func requireTimedOutAtMost(t *testing.T, code int, pass delivery.VerifyPass) {
	t.Helper()
	if code == http.StatusOK {
		return
	}
	require.Equal(t, http.StatusInternalServerError, code, pass)
	for _, r := range pass.Workspaces {
		// No round of any workspace completed, so no lookup was answered;
		// a workspace with nothing due is verified without one.
		require.Zero(t, r.Rounds, "%s (%s) had a lookup answered in a pass that failed", r.Workspace, r.Outcome)
	}
}

// TestVerifyReportsWorkspacesNotReached: 100 workspaces, a 1 s budget and
// lookups of 300 ms: a pass reaches some (each of its 16 workers at most
// four, a round taking a lookup, whatever the machine's speed); those it
// does not are reported (never a silent success), the next pass starts
// with them, and passes in turn reach every workspace.
func TestVerifyReportsWorkspacesNotReached(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server of its own with 100 databases")
	}
	t.Parallel()
	const workspaces = 100
	// The per-server cap is not what this test is about: 100 databases on
	// one server with 8 connections spend the 1 s pass reconnecting.
	h := fleet(t, workspaces, 3, 150, withEnv(EnvVerifyBudget, "1s"), withEnv(EnvSweepBatches, "0"),
		withEnv("DATABASE_MAX_OPEN_POOLS", fmt.Sprint(workspaces)), withEnv("DATABASE_SERVER_MAX_CONNS", "120"))
	var lookups atomic.Int64
	h.slowly(300*time.Millisecond, &lookups)

	code, first := h.verify("")
	requireTimedOutAtMost(t, code, first)
	require.Len(t, first.Workspaces, workspaces)
	require.NotEmpty(t, first.NotReached, "a 1 s pass of 16 workers cannot reach 100 workspaces at 300 ms a lookup")
	var notReached []string
	for _, r := range first.Workspaces {
		if r.Outcome == delivery.OutcomeNotReached {
			notReached = append(notReached, r.Workspace)
			require.Zero(t, r.Checked, r.Workspace)
		}
	}
	require.Equal(t, notReached, first.NotReached, "the response lists exactly the workspaces it did not reach")
	require.Contains(t, h.logs.String(), "the pass's budget did not reach every workspace")
	t.Logf("pass 1 reached %d of %d workspaces", workspaces-len(first.NotReached), workspaces)

	// The workspaces the pass did not finish: not reached, or cut short.
	// (One that failed, as when a busy machine's BigQuery answered none of
	// the pass's lookups, has come to an end, as a verified one has.)
	var unfinished []string
	var finished string
	for _, r := range first.Workspaces {
		switch r.Outcome {
		case delivery.OutcomeVerified:
			finished = r.Workspace
		case delivery.OutcomeFailed:
		default:
			unfinished = append(unfinished, r.Workspace)
		}
	}
	// A pass over other workspaces (another shard, one workspace) does not
	// make the instance forget the ones this pass did not reach. On a busy
	// machine the first pass may finish none (each workspace's first round
	// outlasting its slice): then the one-workspace pass takes one the
	// first pass left unfinished, which leaves the others' order alone.
	if finished == "" {
		finished = unfinished[len(unfinished)-1]
	}
	code, one := h.verify(fmt.Sprintf(`{"workspace": %q}`, finished))
	requireTimedOutAtMost(t, code, one)
	require.Len(t, one.Workspaces, 1)
	if i := slices.Index(unfinished, finished); i >= 0 && slices.Contains([]string{delivery.OutcomeVerified, delivery.OutcomeFailed}, one.Workspaces[0].Outcome) {
		unfinished = slices.Delete(unfinished, i, i+1) // done now: the next pass takes it last
	}

	code, second := h.verify("")
	requireTimedOutAtMost(t, code, second)
	var startedWith []string
	for _, r := range second.Workspaces[:len(unfinished)] {
		startedWith = append(startedWith, r.Workspace)
	}
	require.Equal(t, unfinished, startedWith, "the next pass starts with the workspaces the last one did not reach or finish")
	require.NotEqual(t, delivery.OutcomeNotReached, second.Workspaces[0].Outcome)

	// Pass after pass, every workspace is reached: each pass starts with
	// the workspaces the last one did not reach or finish, so the ones
	// never reached move to the front. (A workspace whose round cannot end
	// within a 1 s pass on a saturated machine is cut every time and holds
	// a worker at the front of each pass, so how many new ones a pass
	// reaches depends on the machine; that one is reached is what the
	// rotation promises, and verification itself is the other tests'.)
	// The bound only stops a rotation that makes no progress.
	reached := map[string]bool{}
	note := func(p delivery.VerifyPass) {
		for _, r := range p.Workspaces {
			if r.Outcome != delivery.OutcomeNotReached {
				reached[r.Workspace] = true
			}
		}
	}
	note(second)
	bound := 5 * workspaces
	passes := 0
	for ; len(reached) < workspaces && passes < bound; passes++ {
		code, pass := h.verify("")
		requireTimedOutAtMost(t, code, pass)
		note(pass)
	}
	require.Len(t, reached, workspaces, "%d passes after the second reach every workspace", bound)
	t.Logf("%d more passes reached every workspace", passes)
}

// TestVerifyShards: scheduler jobs naming shards 0…n-1 verify every
// workspace exactly once between them.
func TestVerifyShards(t *testing.T) {
	t.Parallel()
	ids := []string{"a1", "b2", "c3", "d4", "e5", "f6", "g7"}
	h := newHarness(t, withWorkspaces(ids...), withEnv(EnvSweepBatches, "0"))
	for _, id := range ids {
		h.products(id, 2)
		h.drainAll(id)
	}
	h.answer(h.landed)
	seen := map[string]int{}
	for shard := range 3 {
		code, pass := h.verify(fmt.Sprintf(`{"shard": %d, "shards": 3}`, shard))
		require.Equal(t, http.StatusOK, code, pass)
		require.NotEmpty(t, pass.Workspaces, "shard %d", shard)
		for _, r := range pass.Workspaces {
			seen[r.Workspace]++
			require.Equal(t, 2, r.Verified, r.Workspace)
		}
	}
	for _, id := range ids {
		require.Equal(t, 1, seen[id], "workspace %s verified once across the shards", id)
		require.EqualValues(t, 2, h.count(id, "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NOT NULL"), id)
	}
	require.Len(t, seen, len(ids))
}

// TestVerifyRequestBody: the bodies the Verify function takes, and the
// ones it refuses with a 400 naming what is wrong.
func TestVerifyRequestBody(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withWorkspaces("w1", "w2"), withEnv(EnvSweepBatches, "0"))
	h.answer(h.landed)
	for _, tc := range []struct {
		name, body string
		status     int
		workspaces int
		mentions   string
	}{
		{"empty", "", http.StatusOK, 2, ""},
		{"empty object", "{}", http.StatusOK, 2, ""},
		{"one workspace", `{"workspace": "w2"}`, http.StatusOK, 1, ""},
		{"a shard", `{"shard": 1, "shards": 2}`, http.StatusOK, 1, ""},
		{"one shard of one", `{"shard": 0, "shards": 1}`, http.StatusOK, 2, ""},
		{"unknown workspace", `{"workspace": "nope"}`, http.StatusNotFound, 0, "unknown workspace"},
		{"not JSON", `{`, http.StatusBadRequest, 0, "must be"},
		{"unknown field", `{"workspaces": ["w1"]}`, http.StatusBadRequest, 0, "workspaces"},
		{"two objects", `{} {}`, http.StatusBadRequest, 0, "one JSON object"},
		{"shard out of range", `{"shard": 2, "shards": 2}`, http.StatusBadRequest, 0, "shard 2"},
		{"negative shard", `{"shard": -1, "shards": 2}`, http.StatusBadRequest, 0, "shard -1"},
		{"shards without shard", `{"shards": 2}`, http.StatusBadRequest, 0, "shards without shard"},
		{"shard without shards", `{"shard": 0}`, http.StatusBadRequest, 0, "shards 0"},
		{"workspace and shard", `{"workspace": "w1", "shard": 0, "shards": 2}`, http.StatusBadRequest, 0, "one or the other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, raw := h.verifyRaw(tc.body)
			require.Equal(t, tc.status, code, raw)
			if tc.mentions != "" {
				require.Contains(t, raw, tc.mentions)
			}
			if tc.status == http.StatusOK {
				var pass delivery.VerifyPass
				require.NoError(t, json.Unmarshal([]byte(raw), &pass))
				require.Len(t, pass.Workspaces, tc.workspaces)
			}
		})
	}
}

// TestDrainFloodStaysWithinTheServersBudget: 40 workspaces on one
// PostgreSQL server, each woken by two callers at once: the instance never
// holds more connections to the server than its per-server budget (however
// many workspaces it serves: the drainers waiting for a place back off and
// try again), every wake-up is answered 200 or, while its drainer backs
// off, 503 (the commit still left to it), and every event is published.
//
// The registry names the server three ways, 127.0.0.1, localhost and
// [::1] (it listens on both loopback addresses): one server, one budget.
func TestDrainFloodStaysWithinTheServersBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server of its own with 40 databases")
	}
	t.Parallel()
	if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	} else {
		ln.Close()
	}
	h := fleetOn(t, map[string]string{"max_connections": "100", "listen_addresses": "127.0.0.1,::1"}, 40, 1,
		withHostSpellings("127.0.0.1", "localhost", "[::1]"))
	for id := range h.spaces {
		h.products(id, 250)
		h.spaces[id].pool.Reset()
	}
	var mu sync.Mutex
	codes := map[int]int{}
	answers := map[string][]string{} // by workspace, each caller's answers in order
	stop := h.cluster.WatchClientConnections(t)
	var wg sync.WaitGroup
	for id := range h.spaces {
		for caller := range 2 {
			wg.Go(func() {
				code, body := h.wake(id)
				mu.Lock()
				codes[code]++
				answers[id] = append(answers[id], fmt.Sprintf("caller %d: %d %v", caller, code, body))
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	h.settle()
	peak := stop()
	t.Logf("peak connections %d; answers %v", peak, codes)
	require.LessOrEqual(t, peak, int64(database.DefaultServerMaxConns), "within the per-server budget")
	for code := range codes {
		require.Contains(t, []int{http.StatusOK, http.StatusServiceUnavailable}, code)
	}
	for id := range h.spaces {
		if left := h.count(id, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"); left != 0 {
			t.Fatalf("%s: %d events left pending after its drainer ended; its answers:\n%s\nits log lines:\n%s",
				id, left, strings.Join(answers[id], "\n"), linesMentioning(h.logs.String(), `"`+id+`"`))
		}
		distinct := map[string]bool{}
		for _, e := range h.published(id) {
			distinct[e.EventID] = true
		}
		require.EqualValues(t, h.count(id, "SELECT count(*) FROM _ontology_replication_delivery"), len(distinct), "every event published: %s", id)
	}
}

// linesMentioning is the lines of logs that contain s.
func linesMentioning(logs, s string) string {
	var out []string
	for line := range strings.Lines(logs) {
		if strings.Contains(line, s) {
			out = append(out, strings.TrimSuffix(line, "\n"))
		}
	}
	return strings.Join(out, "\n")
}
