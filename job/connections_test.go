package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// sessionsOpened returns a function that reports how many sessions the
// server has opened on the workspace's database since it was called
// (pgtest.SessionsOpened); the harness's own pool is not used meanwhile.
func (h *harness) sessionsOpened(t testing.TB, id string) func() int64 {
	t.Helper()
	return pgtest.SessionsOpened(h.ctx, t, h.spaces[id].url)
}

// TestCommandsHoldOnePoolPerWorkspace: a drain of tens of thousands of
// events opens at most its pool's size of sessions, whatever the
// scheduling, and so do a replay and a verify pass: the workspace's pool
// lives as long as the command works on the workspace. With one connection
// a pool closed between batches would open one session per batch.
func TestCommandsHoldOnePoolPerWorkspace(t *testing.T) {
	if testing.Short() {
		t.Skip("drains 20,000 events")
	}
	t.Parallel()
	for _, size := range []string{"1", "3"} {
		t.Run("pool size "+size, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, &sdkfixture.V4Template)
			h.start("w1")
			h.products("w1", 20_000)
			env := map[string]string{"DATABASE_POOL_SIZE": size}
			for _, args := range [][]string{{"drain"}, {"replay"}, {"verify", "--budget", "1m"}} {
				opened := h.sessionsOpened(t, "w1")
				out, logs, err := h.runEnv(h.ctx, env, args...)
				require.NoError(t, err, "%s\n%s", out, logs)
				n := opened()
				t.Logf("job %s: %d sessions", args[0], n)
				limit, err := strconv.Atoi(size)
				require.NoError(t, err)
				require.LessOrEqual(t, n, int64(limit), "job %s opened %d sessions with a pool of %s", args[0], n, size)
				require.Positive(t, n)
			}
			require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
		})
	}
}

// TestCommandsRideOutUnavailable: Pub/Sub answers UNAVAILABLE to a burst of
// publish requests in the middle of `job drain` and of `job replay`; both
// retry with backoff and complete, every event published, none accepted
// that Pub/Sub did not take. A burst longer than the retry budget fails the
// command with the cause.
func TestCommandsRideOutUnavailable(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	h.start("w1")
	h.products("w1", 1500)
	var requests atomic.Int64
	refuse := func(from, to int64) {
		requests.Store(0)
		h.mu.Lock()
		h.onPublish = func(*pubsubpb.PublishRequest) error {
			if n := requests.Add(1); n >= from && n < to {
				return status.Error(codes.Unavailable, "the service is unavailable (injected)")
			}
			return nil
		}
		h.mu.Unlock()
	}
	check := func(t *testing.T) {
		t.Helper()
		published := h.published("w1")
		rows, err := h.spaces["w1"].pool.Query(h.ctx, `SELECT d.event_id::text, t.source_id, d.generation::text, d.accepted_at IS NOT NULL
			FROM _ontology_replication_delivery d JOIN _ontology_replication_targets t USING (generation)`)
		require.NoError(t, err)
		var id, source, gen string
		var accepted bool
		total := 0
		_, err = pgx.ForEachRow(rows, []any{&id, &source, &gen, &accepted}, func() error {
			total++
			require.True(t, accepted, "every event published and acknowledged")
			require.Positive(t, published[event.ID(source, id, gen)], "acknowledged only once Pub/Sub took it")
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, 1500+h.baseline("w1"), total)
	}
	for _, command := range []string{"drain", "replay"} {
		t.Run(command, func(t *testing.T) {
			refuse(3, 15) // twelve requests in a row refused, the drain's third onwards (a failed request's largest event goes alone next: two requests a session)
			out, logs, err := h.run(h.ctx, command)
			require.NoError(t, err, "%s\n%s", out, logs)
			require.Contains(t, logs, "a transient fault; retrying")
			require.Contains(t, logs, `"attempt":`)
			check(t)
		})
	}
	t.Run("outage past the budget", func(t *testing.T) {
		refuse(1, 1<<40)
		h.products("w1", 10)
		_, _, err := h.runEnv(h.ctx, map[string]string{"REPLICATION_RETRY_BUDGET": "2s"}, "drain")
		require.ErrorContains(t, err, "still failing after")
		require.ErrorContains(t, err, "Unavailable")
	})
}

// TestVerifyWithoutBigQueryFails: a pass in which BigQuery never answered
// is a failed pass, whatever its budget, not a partial one.
func TestVerifyWithoutBigQueryFails(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	h.start("w1")
	h.products("w1", 10)
	h.mustRun("drain")
	registry := h.silentBigQuery(t)
	out, logs, err := h.runEnv(h.ctx, map[string]string{"REPLICATION_WORKSPACES": registry}, "verify", "--budget", "2s", "--json")
	require.Error(t, err, "%s\n%s", out, logs)
	require.ErrorContains(t, err, "BigQuery answered no lookup of the pass")
	require.Contains(t, logs, `"severity":"ERROR"`)
	require.Contains(t, out, `"outcome":"failed"`)
}

// silentBigQuery returns the harness's registry with every workspace's
// BigQuery endpoint a server that never answers (until the request is
// given up, or the test ends).
func (h *harness) silentBigQuery(t *testing.T) string {
	t.Helper()
	stop := make(chan struct{})
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(func() { close(stop); silent.Close() })
	return strings.ReplaceAll(h.env["REPLICATION_WORKSPACES"], h.bqURL, silent.URL)
}

// baseline counts a workspace's baseline events.
func (h *harness) baseline(id string) int {
	return int(h.count(id, "SELECT count(*) FROM _ontology_replication_delivery WHERE is_baseline"))
}

// TestReplayRidesOutALostConnection: a replay page's backend is terminated
// mid-statement (a failover, a server restart); the page is rolled back and
// retried, and the replay completes, every event published again.
func TestReplayRidesOutALostConnection(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	h.start("w1")
	h.products("w1", 2500)
	h.mustRun("drain")
	b := h.blockReplayAt(t, "w1", 1500) // in the second page
	wait := h.runCut(h.ctx, nil, "replay")
	b.terminate(b.waiter())
	b.release()
	logs, err := wait()
	require.NoError(t, err, logs)
	require.Contains(t, logs, "a transient fault; retrying")
	require.Contains(t, logs, `"operation":"replay page"`)
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
	for id, n := range h.published("w1") {
		require.Equal(t, 2, n, "event %s published again by the replay", id)
	}
}

// TestVerifyExitCodes: `job verify` succeeds (exit 0) only when every
// workspace was reached and verified; a workspace the budget did not reach
// fails the command (exit 1, not the usage error's 2), naming it.
func TestVerifyExitCodes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template, &sdkfixture.V4Template, &sdkfixture.V4Template)
	for _, id := range []string{"w1", "w2", "w3"} {
		h.start(id)
		h.products(id, 5)
	}
	h.mustRun("drain")
	_, logs, err := h.run(h.ctx, "verify", "--budget", "1m")
	require.NoError(t, err, "every workspace reached and verified: exit 0\n%s", logs)

	h.products("w1", 5)
	h.products("w2", 5)
	h.products("w3", 5)
	h.mustRun("drain")
	// BigQuery never answers: the first workspace's lookup holds the only
	// worker until the budget ends, and the others are never reached.
	registry := h.silentBigQuery(t)
	// Each workspace its own events table, so that each is a unit of the
	// pass of its own (workspaces sharing a table are looked up together).
	parts := strings.Split(registry, `{"id": `)
	for i := range parts {
		for _, id := range []string{"w2", "w3"} {
			if strings.HasPrefix(parts[i], `"`+id+`"`) {
				parts[i] = strings.Replace(parts[i], `"location": "EU"`, `"location": "EU", "table": "events_`+id+`"`, 1)
			}
		}
	}
	registry = strings.Join(parts, `{"id": `)
	out, logs, err := h.runEnv(h.ctx, map[string]string{"REPLICATION_WORKSPACES": registry}, "verify", "--budget", "2s", "--parallel", "1", "--json")
	require.Error(t, err, "%s\n%s", out, logs)
	var usage usageError
	require.False(t, errors.As(err, &usage), "a failure, not a usage error: exit 1")
	require.ErrorContains(t, err, "not reached within the --budget")
	require.Contains(t, out, `"not_reached"`)
}

// TestParallelBoundsWorkspacesInFlight: `--parallel 2` works on two
// workspaces at a time, counted where the server shows it. Each
// workspace's first acknowledgement waits for the receipts table, which the
// test holds in SHARE mode (a claim reads no receipt); when
// two workspaces wait, the workspaces not yet begun have not opened a
// single session, and only once the test lets those two go do the next
// two begin.
func TestParallelBoundsWorkspacesInFlight(t *testing.T) {
	t.Parallel()
	templates := make([]*pgtest.Template, 5)
	for i := range templates {
		templates[i] = &sdkfixture.V4Template
	}
	h := newHarness(t, templates...)
	blockers := map[string]*blocker{}
	dbs := map[string]string{} // database name → workspace
	for id, s := range h.spaces {
		h.start(id)
		h.products(id, 150)
		blockers[id] = h.blocker(t, id, `LOCK TABLE _ontology_replication_receipts IN SHARE MODE`)
		u, err := url.Parse(s.url)
		require.NoError(t, err)
		dbs[strings.TrimPrefix(u.Path, "/")] = id
	}
	admin, err := pgx.Connect(h.ctx, pgtest.Shared(t).AdminURL())
	require.NoError(t, err)
	defer func() { _ = admin.Close(h.ctx) }()
	sessions := func(condition string) map[string]int {
		rows, err := admin.Query(h.ctx, `SELECT datname, count(*) FROM pg_stat_activity
			WHERE application_name = 'ontology-replication' AND `+condition+` GROUP BY datname`)
		require.NoError(t, err)
		out := map[string]int{}
		var db string
		var n int
		_, err = pgx.ForEachRow(rows, []any{&db, &n}, func() error {
			if id, ok := dbs[db]; ok {
				out[id] = n
			}
			return nil
		})
		require.NoError(t, err)
		return out
	}

	done := make(chan error, 1)
	go func() {
		// Room for every workspace's pool, so that the bound on open
		// pools (also --parallel by default) cannot stand in for
		// --parallel's own.
		_, logs, err := h.runEnv(h.ctx, map[string]string{"DATABASE_MAX_OPEN_POOLS": "10"}, "drain", "--parallel", "2")
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, logs)
		}
		done <- err
	}()
	notBegun := map[string]bool{}
	for id := range h.spaces {
		notBegun[id] = true
	}
	for len(notBegun) > 0 {
		want := min(2, len(notBegun))
		var waiting []string
		require.Eventually(t, func() bool {
			waiting = waiting[:0]
			for id := range sessions("wait_event_type = 'Lock'") {
				if notBegun[id] {
					waiting = append(waiting, id)
				}
			}
			return len(waiting) >= want
		}, time.Minute, 5*time.Millisecond, "%d workspaces begin", want)
		require.Len(t, waiting, want, "no more than --parallel workspaces at once")
		for _, id := range waiting {
			delete(notBegun, id)
		}
		open := sessions("true")
		for id := range notBegun {
			require.Zero(t, open[id], "%s has not begun: no session of its own yet", id)
		}
		for _, id := range waiting {
			blockers[id].release()
		}
	}
	require.NoError(t, <-done)
	for id := range h.spaces {
		require.Zero(t, h.count(id, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"), id)
	}
}

// TestStatusGivesUpOnAnUnreachableDatabaseSoon: `job status` of a
// database nothing listens for retries for 10 s (not the commands' 2
// minutes: a person is waiting), in a handful of WARNING lines, and
// --retry-budget sets another bound; a bad one is a usage error.
func TestStatusGivesUpOnAnUnreachableDatabaseSoon(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	reg := fmt.Sprintf(`{"workspaces": [{"id": "w1", "database": {"url": "postgres://u@%s/db?connect_timeout=1"},
		"pubsub": {"project": "p1", "topic": "events"}, "bigquery": {"project": "p1", "endpoint": "http://127.0.0.1:1"}}]}`, addr)
	env := func(k string) string { return map[string]string{"REPLICATION_WORKSPACES": reg}[k] }
	for _, c := range []struct {
		args   []string
		budget time.Duration
		// mostRetries bounds the WARNING lines: the pauses are jittered
		// (gax.Backoff draws each from (0, its cap]), so their count is
		// not fixed, but a handful, not one per 100 ms.
		mostRetries int
	}{{[]string{"status"}, 10 * time.Second, 16}, {[]string{"status", "--retry-budget", "1s"}, time.Second, 8}} {
		var stdout, stderr bytes.Buffer
		err := run(t.Context(), c.args, env, &stdout, &stderr)
		require.Error(t, err, "%v", c.args)
		retries, paused := retryLines(t, stderr.String())
		require.Positive(t, retries, "%v: it retried", c.args)
		require.LessOrEqual(t, paused, c.budget, "%v: its pauses fit its budget:\n%s", c.args, stderr.String())
		require.LessOrEqual(t, retries, c.mostRetries, "%v: a handful of retries:\n%s", c.args, stderr.String())
	}
	err = run(t.Context(), []string{"status", "--retry-budget", "2h"}, env, io.Discard, io.Discard)
	require.ErrorAs(t, err, new(usageError))
}

// retryLines counts a command's retry WARNING lines and adds up the pauses
// they announce.
func retryLines(t *testing.T, logs string) (int, time.Duration) {
	t.Helper()
	var n int
	var paused time.Duration
	for _, line := range strings.Split(logs, "\n") {
		var entry struct {
			Message string  `json:"message"`
			RetryIn float64 `json:"retry_in_seconds"`
		}
		if json.Unmarshal([]byte(line), &entry) != nil || !strings.Contains(entry.Message, "retrying") {
			continue
		}
		n++
		paused += time.Duration(entry.RetryIn * float64(time.Second))
	}
	return n, paused
}
