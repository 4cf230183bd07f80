package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// upgradedTemplate is a protocol-3 database with 2,500 history events, half
// acknowledged and 500 verified, upgraded to protocol 4: its target needs a
// backfill of three pages of product history.
var upgradedTemplate = pgtest.Template{Name: "job_upgraded", Build: func(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if err := sdkfixture.Install(ctx, conn, sdkfixture.Demo, 3); err != nil {
		return err
	}
	if err := sdkfixture.BulkCreate(ctx, conn, sdkfixture.Demo, "product", "title", 20, 20); err != nil { // baseline
		return err
	}
	g, err := sdkfixture.StartGeneration(ctx, conn, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
	if err != nil {
		return err
	}
	if err := sdkfixture.BulkCreate(ctx, conn, sdkfixture.Demo, "product", "title", 2500, 500); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, `INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at, verified_at)
		SELECT $1::uuid, id, now(), CASE WHEN row_number() OVER (ORDER BY id) <= 500 THEN now() END
		FROM (SELECT id FROM product_history WHERE replication IS NOT NULL ORDER BY id LIMIT 1250) h`, g.Generation); err != nil {
		return err
	}
	return sdkfixture.Upgrade(ctx, conn, sdkfixture.Demo)
}}

func statusOf(t *testing.T, h *harness, args ...string) []workspaceStatus {
	t.Helper()
	var out []workspaceStatus
	require.NoError(t, json.Unmarshal([]byte(h.mustRun(append([]string{"status", "--json"}, args...)...)), &out))
	return out
}

// requireLag checks a lag of `job status` against the database: its time is
// what query reads, and its age in seconds that time's distance from a
// moment between before and after (the clocks read around the command).
func requireLag(t *testing.T, h *harness, id, query string, at *time.Time, age *float64, before, after time.Time) {
	t.Helper()
	var want time.Time
	require.NoError(t, h.spaces[id].pool.QueryRow(h.ctx, query).Scan(&want))
	require.NotNil(t, at)
	require.WithinDuration(t, want, *at, time.Millisecond, "the lag's time is the database's")
	require.NotNil(t, age)
	require.GreaterOrEqual(t, *age, before.Sub(want).Seconds()-0.01, "age %v", *age)
	require.LessOrEqual(t, *age, after.Sub(want).Seconds()+0.01, "age %v", *age)
}

func TestCommandsOnProtocol4(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	h.products("w1", 5)
	g := h.start("w1")
	h.products("w1", 250)

	before := time.Now()
	s := statusOf(t, h)[0]
	after := time.Now()
	// The delivery lag, from the database: the oldest pending row's
	// next_verify_at, and its age between the two clocks read around the
	// command (to the second it is rounded to).
	requireLag(t, h, "w1", `SELECT min(next_verify_at) FROM _ontology_replication_delivery WHERE accepted_at IS NULL`,
		s.OldestPending, s.OldestPendingAgeSeconds, before, after)
	require.Equal(t, workspaceStatus{Workspace: "w1", Protocol: 4, Generation: g.Generation, Enabled: true,
		BaselineComplete: true, BackfillComplete: true, ReplayComplete: true, Total: 255, Pending: 255,
		OldestPending: s.OldestPending, OldestPendingAgeSeconds: s.OldestPendingAgeSeconds}, s, "fresh (the lag checked above); no dead letters")

	h.mustRun("drain")
	require.Len(t, h.published("w1"), 255)
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))

	h.mustRun("verify", "--workspace", "w1")
	s = statusOf(t, h, "--workspace", "w1")[0]
	require.Equal(t, int64(255), s.Verified)
	require.True(t, s.InitiallyReady, "ready")

	out := h.mustRun("views")
	require.Equal(t, "w1\tp1.ontology_internal.customer\nw1\tp1.ontology_internal.product\nw1\tp1.ontology_internal.order\nw1\tp1.ontology_internal.order_products\n", out)
	require.Len(t, h.ddl, 4)
	require.Contains(t, h.ddl[1], "entity_id = 'ent_product'")

	table := h.mustRun("status")
	require.Contains(t, table, "WORKSPACE")
	require.Contains(t, table, g.Generation)

	// Replay: every event back to pending, then published again.
	h.mustRun("replay", "--workspace", "w1")
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
	for id, n := range h.published("w1") {
		require.Equal(t, 2, n, "event %s published once more by the replay", id)
	}
	s = statusOf(t, h)[0]
	require.True(t, s.ReplayComplete)
	require.False(t, s.InitiallyReady, "replayed events are not verified yet")
	h.mustRun("verify")
	require.True(t, statusOf(t, h)[0].InitiallyReady)
}

func TestStatusStates(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &upgradedTemplate, &sdkfixture.V4Template)
	s := statusOf(t, h, "--workspace", "w1")[0]
	require.False(t, s.BackfillComplete, "backfilling")
	require.False(t, s.InitiallyReady)
	require.Equal(t, int64(0), s.Total, "nothing is queued before the backfill")

	h.start("w2")
	h.products("w2", 3)
	_, err := h.spaces["w2"].pool.Exec(h.ctx, `UPDATE product_history SET replication = jsonb_set(replication, '{payload}', to_jsonb(repeat('x', 10000001)))
		WHERE id = (SELECT min(id::text)::uuid FROM product_history)`)
	require.NoError(t, err)
	s = statusOf(t, h, "--workspace", "w2")[0]
	require.Zero(t, s.SetAside.Count, "nothing set aside before a drain met it")
	h.mustRun("drain", "--workspace", "w2")
	// Accepted 90 minutes ago, so that the age is far from zero.
	_, err = h.spaces["w2"].pool.Exec(h.ctx, `UPDATE _ontology_replication_delivery SET accepted_at = accepted_at - interval '90 minutes' WHERE accepted_at IS NOT NULL`)
	require.NoError(t, err)
	before := time.Now()
	s = statusOf(t, h, "--workspace", "w2")[0]
	after := time.Now()
	requireLag(t, h, "w2", `SELECT min(accepted_at) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL AND verified_at IS NULL`,
		s.OldestUnverified, s.OldestUnverifiedAgeSeconds, before, after)
	require.Greater(t, *s.OldestUnverifiedAgeSeconds, 90*60.0, "accepted 90 minutes ago")
	require.Zero(t, s.Pending, "the set-aside event is counted apart from the pending ones")
	require.Nil(t, s.OldestPending, "and is not the delivery lag")
	require.Equal(t, int64(1), s.Total-s.Accepted, "it stays pending for the SDK")
	require.EqualValues(t, 2, s.Unverified, "the two others were accepted, not verified yet")
	require.EqualValues(t, 1, s.SetAside.Count, "an event too large for Pub/Sub is set aside")
	require.Len(t, s.SetAside.Events, 1)
	require.Equal(t, string(store.ReasonTooLarge), s.SetAside.Events[0].Reason)
	require.NotNil(t, s.SetAside.OldestAgeSeconds, "the set-aside lag")
	require.True(t, s.SetAside.Oldest.Equal(s.SetAside.Events[0].Since.Truncate(time.Microsecond)) || s.SetAside.Oldest.Before(s.SetAside.Events[0].Since),
		"set aside once: since its first set-aside")
	table := h.mustRun("status", "--workspace", "w2")
	require.Regexp(t, `\b1 \(\d+s\)`, table, "the set-aside count with its age")

	// Replaying: initialised, not advanced.
	st, err := store.New(h.spaces["w2"].pool, store.Config{})
	require.NoError(t, err)
	_, tg, err := st.ActiveTarget(h.ctx)
	require.NoError(t, err)
	require.NoError(t, st.InitReplay(h.ctx, tg))
	s = statusOf(t, h, "--workspace", "w2")[0]
	require.False(t, s.ReplayComplete, "replaying")
}

func TestBackfillUpgradedDatabase(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &upgradedTemplate)
	_, logs, err := h.run(h.ctx, "backfill", "--workspace", "w1")
	require.NoError(t, err)
	require.Contains(t, logs, `"message":"replication backfill done"`)
	require.Contains(t, logs, `"rows":2520`)
	require.EqualValues(t, 2520, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery"))
	require.EqualValues(t, 500, h.count("w1", "SELECT verified_count FROM _ontology_replication_targets"))
	require.Len(t, h.published("w1"), 2520-1250, "only what was never acknowledged is drained")
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}

func TestBackfillRefusesIncompleteBaseline(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &upgradedTemplate)
	_, err := h.spaces["w1"].pool.Exec(h.ctx, "UPDATE _ontology_replication_targets SET baseline_complete = false")
	require.NoError(t, err)
	for _, cmd := range []string{"backfill", "replay"} {
		_, _, err = h.run(h.ctx, cmd)
		require.ErrorContains(t, err, "baseline is incomplete (the SDK advances it)")
	}
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery"))
}

func terminate(t *testing.T, h *harness, id string) {
	conn, err := pgx.Connect(context.Background(), pgtest.Shared(t).AdminURL())
	if !assert.NoError(t, err) {
		return
	}
	defer conn.Close(context.Background())
	var db string
	_ = h.spaces[id].pool.QueryRow(context.Background(), "SELECT current_database()").Scan(&db)
	_, err = conn.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = 'ontology-replication' AND datname = $1`, db)
	assert.NoError(t, err)
}

func TestReplayWhileWritersCommit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	h.start("w1")
	h.products("w1", 3000)
	h.mustRun("drain")
	h.mustRun("verify")

	ctx, cancel := context.WithCancel(h.ctx)
	var writes atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			if _, err := h.spaces["w1"].w.Create(h.ctx, "product", map[string]any{"title": "during the replay"}); !assert.NoError(t, err) {
				return
			}
			writes.Add(1)
		}
	})
	// The replay's second page waits on a row the test holds, after the
	// fence: twenty writes commit for certain while the replay runs.
	b := h.blockReplayAt(t, "w1", 1000)
	wait := h.runCut(h.ctx, nil, "replay")
	b.waiter()
	for range 20 {
		_, err := h.spaces["w1"].w.Create(h.ctx, "product", map[string]any{"title": "after the fence"})
		require.NoError(t, err)
		writes.Add(1)
	}
	b.release()
	logs, err := wait()
	require.NoError(t, err, logs)
	cancel()
	wg.Wait()

	var fence int64
	require.NoError(t, h.spaces["w1"].pool.QueryRow(h.ctx, "SELECT initial_revision FROM _ontology_replication_targets").Scan(&fence))
	atOrBelow := h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE revision <= $1", fence)
	require.GreaterOrEqual(t, atOrBelow, int64(3000), "the fence covers everything written before the replay began")
	h.mustRun("drain")
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"), "all rows end published")
	pub := h.published("w1")
	require.Len(t, pub, 3000+int(writes.Load()))
	// Rows after the fence were left alone by the replay: each published once.
	rows, err := h.spaces["w1"].pool.Query(h.ctx, `SELECT d.event_id::text, t.source_id::text, t.generation::text
		FROM _ontology_replication_delivery d JOIN _ontology_replication_targets t USING (generation) WHERE d.revision > $1`, fence)
	require.NoError(t, err)
	after, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var id, src, gen string
		err := r.Scan(&id, &src, &gen)
		return event.ID(src, id, gen), err
	})
	require.NoError(t, err)
	require.EqualValues(t, int64(len(pub))-atOrBelow, len(after))
	require.GreaterOrEqual(t, len(after), 20, "writes landed after the fence")
	for _, id := range after {
		require.Equal(t, 1, pub[id], "an event written after the fence is published once")
	}
	twice := 0
	for _, n := range pub {
		if n >= 2 {
			twice++
		}
	}
	require.GreaterOrEqual(t, twice, 3000, "every row delivered before the replay was published again")
	h.mustRun("verify")
	require.EqualValues(t, 3000+writes.Load(), h.count("w1", "SELECT verified_count FROM _ontology_replication_targets"))
}

// TestTaskSharding: with CLOUD_RUN_TASK_COUNT tasks, each task drains
// exactly its share of the workspaces (every count-th in id order), and
// together they drain each workspace once.
func TestTaskSharding(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template, &sdkfixture.V4Template, &sdkfixture.V4Template)
	for _, id := range []string{"w1", "w2", "w3"} {
		h.start(id)
		h.products(id, 10)
	}
	for index, want := range [][]string{{"w1", "w3"}, {"w2"}} {
		before := map[string]int{}
		for _, id := range []string{"w1", "w2", "w3"} {
			before[id] = len(h.published(id))
		}
		out, logs, err := h.runEnv(h.ctx, map[string]string{"CLOUD_RUN_TASK_COUNT": "2", "CLOUD_RUN_TASK_INDEX": strconv.Itoa(index)}, "drain")
		require.NoError(t, err, logs)
		var touched []string
		for _, id := range []string{"w1", "w2", "w3"} {
			if len(h.published(id)) > before[id] {
				touched = append(touched, id)
			}
		}
		require.Equal(t, want, touched, "task %d drained only its share", index)
		var listed []string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			listed = append(listed, strings.SplitN(line, "\t", 2)[0])
		}
		require.Equal(t, want, listed, "task %d reports only its share", index)
	}
	for _, id := range []string{"w1", "w2", "w3"} {
		pub := h.published(id)
		require.Len(t, pub, 10, "%s drained", id)
		for _, n := range pub {
			require.Equal(t, 1, n, "%s processed by exactly one task", id)
		}
	}
}

// TestBadInput: every mistake in the command line or the configuration
// gets a one-line cause naming it; a usage error is told apart (the job
// exits 2 for it, 1 for any other failure); nothing changes.
func TestBadInput(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	h.start("w1")
	h.products("w1", 3)
	cases := []struct {
		name  string
		args  []string
		env   map[string]string
		want  string
		usage bool
	}{
		{"no command", nil, nil, "no command given", true},
		{"unknown command", []string{"publish"}, nil, `unknown command "publish"`, true},
		{"the old local command", []string{"local"}, nil, "go run ./job/local", true},
		{"unknown workspace", []string{"drain", "--workspace", "w9"}, nil, `unknown workspace "w9"`, true},
		{"unknown generation", []string{"replay", "--workspace", "w1", "--generation", "00000000-0000-4000-8000-000000000000"}, nil, "unknown replication generation", false},
		{"malformed generation", []string{"status", "--workspace", "w1", "--generation", "nope"}, nil, "status failed for w1: ", false},
		{"generation without workspace", []string{"replay", "--generation", "00000000-0000-4000-8000-000000000000"}, nil, "--generation needs --workspace", true},
		{"unknown flag", []string{"drain", "--everything"}, nil, "flag provided but not defined", true},
		{"a flag of another command", []string{"drain", "--generation", "00000000-0000-4000-8000-000000000000"}, nil, "flag provided but not defined: --generation", true},
		{"budget zero", []string{"verify", "--budget", "0"}, nil, "--budget 0s: want 1s to 1h", true},
		{"budget too long", []string{"verify", "--budget", "2h"}, nil, "--budget 2h0m0s: want 1s to 1h", true},
		{"parallel zero", []string{"drain", "--parallel", "0"}, nil, "--parallel 0: want 1 to 64", true},
		{"an argument", []string{"drain", "w1"}, nil, `unexpected argument "w1"`, true},
		{"missing registry", []string{"drain"}, map[string]string{"REPLICATION_WORKSPACES": ""}, "no workspace registry", false},
		{"bad registry", []string{"drain"}, map[string]string{"REPLICATION_WORKSPACES": `{"workspaces": [{"id": "w1"}]}`}, "workspaces[0] (w1).database", false},
		{"bad pool size", []string{"drain"}, map[string]string{"DATABASE_POOL_SIZE": "100"}, "DATABASE_POOL_SIZE", false},
		{"bad log level", []string{"drain"}, map[string]string{"LOG_LEVEL": "loud"}, "LOG_LEVEL", false},
		{"bad task index", []string{"drain"}, map[string]string{"CLOUD_RUN_TASK_COUNT": "2", "CLOUD_RUN_TASK_INDEX": "2"}, "CLOUD_RUN_TASK_INDEX", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := h.runEnv(h.ctx, c.env, c.args...)
			require.ErrorContains(t, err, c.want)
			require.NotContains(t, strings.TrimSpace(oneLine(err.Error())), "\n", "a one-line cause")
			var usage usageError
			require.Equal(t, c.usage, errors.As(err, &usage), "told apart as a usage error: %v", err)
		})
	}
	require.Empty(t, h.pubsub.Messages(), "nothing changed")
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"))
}

// TestHelp: -h on the job and on every command prints its usage and
// succeeds.
func TestHelp(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	out, _, err := h.run(h.ctx, "-h")
	require.NoError(t, err)
	for _, c := range commands {
		require.Contains(t, out, c.name)
		cmdOut, _, err := h.run(h.ctx, c.name, "-h")
		require.NoError(t, err, c.name)
		require.Contains(t, cmdOut, "usage: job "+c.name)
		require.Contains(t, cmdOut, "--workspace")
		for _, f := range c.flags {
			require.Contains(t, cmdOut, "--"+f, "%s documents --%s", c.name, f)
		}
	}
	out, _, err = h.run(h.ctx, "--version")
	require.NoError(t, err)
	require.Regexp(t, `^replication job \S+, go1\.\d+`, out, "the build's version and Go's")
}

// TestCount: one thing, or several.
func TestCount(t *testing.T) {
	t.Parallel()
	for n, want := range map[int]string{0: "0 messages", 1: "1 message", 2: "2 messages"} {
		require.Equal(t, want, count(n, "message"))
	}
	require.Equal(t, "2 copies", count(2, "copy"))
}

// TestJSONIsOneDocument: --json writes one document, whatever the number
// of workspaces.
func TestJSONIsOneDocument(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template, &sdkfixture.V4Template)
	h.withWarehouse()
	h.start("w1")
	h.start("w2")
	h.products("w1", 3)
	for _, args := range [][]string{{"drain", "--json"}, {"status", "--json"}, {"set-aside", "--json"}, {"verify", "--json"},
		{"backfill", "--json"}, {"replay", "--json"}, {"replay", "--entity", "product", "--json"}, {"views", "--json"},
		{"audit", "--json"}, {"repair", "--json"}, {"dead-letter", "--json"}} {
		h.land()
		out := h.mustRun(args...)
		dec := json.NewDecoder(strings.NewReader(out))
		var doc any
		require.NoError(t, dec.Decode(&doc), "%v", args)
		require.False(t, dec.More(), "%v: one document", args)
		require.Equal(t, 1, strings.Count(strings.TrimSpace(out), "\n")+1, "%v: compact when not on a terminal", args)
		requireSnakeCase(t, fmt.Sprint(args), doc)
	}
}

// requireSnakeCase checks that every key of a JSON document is a
// lower-case name with underscores, as the log fields are, and that no
// value is a duration written as text ("13s"): durations are *_seconds
// numbers.
func requireSnakeCase(t *testing.T, at string, doc any) {
	t.Helper()
	switch v := doc.(type) {
	case map[string]any:
		for k, e := range v {
			require.Regexp(t, `^[a-z][a-z0-9_]*$`, k, "%s: key %q", at, k)
			requireSnakeCase(t, at+"."+k, e)
		}
	case []any:
		for i, e := range v {
			requireSnakeCase(t, fmt.Sprintf("%s[%d]", at, i), e)
		}
	case string:
		if _, err := time.ParseDuration(v); err == nil && v != "0" {
			t.Errorf("%s: %q is a duration written as text", at, v)
		}
	}
}

// lineWriter signals each line written to it.
type lineWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.Reset()
			w.buf.WriteString(line)
			return len(p), nil
		}
		w.lines <- line
	}
}

// TestStatusWatchInAPipe: `status --watch` writes one JSON line per
// interval when its output is not a terminal, each with both lags.
func TestStatusWatchInAPipe(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	h.start("w1")
	h.products("w1", 4)
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	out := &lineWriter{lines: make(chan string, 10)}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"status", "--watch", "1s"}, func(k string) string { return h.env[k] }, out, io.Discard)
	}()
	for i := range 2 {
		line := <-out.lines
		var all []workspaceStatus
		require.NoError(t, json.Unmarshal([]byte(line), &all), "line %d is one JSON document: %s", i, line)
		require.Len(t, all, 1)
		require.EqualValues(t, 4, all[0].Pending)
		require.NotNil(t, all[0].OldestPendingAgeSeconds)
	}
	cancel()
	require.NoError(t, <-done)
}

// TestFailedWorkSaysSo: a drain that fails logs "replication drain failed"
// at ERROR with its cause, never "replication drain done"; the command's
// error names the cause.
func TestFailedWorkSaysSo(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	h.start("w1")
	h.products("w1", 3)
	_, err := h.pubsub.GServer.DeleteTopic(h.ctx, &pubsubpb.DeleteTopicRequest{Topic: "projects/p1/topics/events-w1"})
	require.NoError(t, err)
	_, logs, err := h.run(h.ctx, "drain", "--workspace", "w1")
	require.Error(t, err)
	require.NotContains(t, logs, `"message":"replication drain done"`)
	var failed map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs), "\n") {
		var line map[string]any
		if json.Unmarshal([]byte(l), &line) == nil && line["message"] == "replication drain failed" {
			failed = line
		}
	}
	require.NotNil(t, failed, logs)
	require.Equal(t, "ERROR", failed["severity"])
	require.Equal(t, delivery.CausePubSubMisconfigured, failed["cause"])
}

// TestStatusJSONKeys: `job status --json`'s keys are an interface scripts
// read: the document's keys, read as JSON (not through the structs that
// write it), are these, so that a rename fails here.
func TestStatusJSONKeys(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	h.start("w1")
	h.products("w1", 2)
	var docs []map[string]any
	require.NoError(t, json.Unmarshal([]byte(h.mustRun("status", "--json")), &docs))
	require.Len(t, docs, 1)
	var keys []string
	for k := range docs[0] {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	require.Equal(t, []string{"accepted", "backfill_complete", "baseline_complete", "dead_letters", "due_verifications", "enabled",
		"generation", "initially_ready", "oldest_pending", "oldest_pending_age_seconds", "pending", "protocol", "replay_complete",
		"set_aside", "total", "unverified", "verified", "workspace"}, keys)
	aside, ok := docs[0]["set_aside"].(map[string]any)
	require.True(t, ok)
	require.Contains(t, aside, "count")
}

// TestReplayProgressLine: the status line of a replay in progress: the
// events sent back in all, their share, and each entity's.
func TestReplayProgressLine(t *testing.T) {
	t.Parallel()
	got := progressLine([]delivery.EntityProgress{{Entity: "customer", Done: 250, Total: 1000}, {Entity: "order", Done: 750, Total: 1000}}, "sent back")
	require.Equal(t, "1000 of 2000 events sent back (50%): customer 250 of 1000, order 750 of 1000", got)
}

// TestVersionNamesTheCommit: a build made as cloudbuild.yaml makes the
// image, from an upload with no .git (no VCS stamping) and the commit
// passed with -ldflags, names its commit.
func TestVersionNamesTheCommit(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "job")
	out, err := exec.Command("go", "build", "-buildvcs=false", "-ldflags", "-X main.commit=0123abcd", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	out, err = exec.Command(bin, "--version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "commit 0123abcd")
}
