package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/logging"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// The command line itself: its input checks, help, JSON and progress lines.

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
		helpOut, _, err := h.run(h.ctx, "help", c.name)
		require.NoError(t, err, c.name)
		require.Equal(t, cmdOut, helpOut, "job help %s is job %s -h", c.name, c.name)
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

// TestLogFormat: log lines for a person on a terminal, JSON elsewhere or
// when asked; another format is refused.
func TestLogFormat(t *testing.T) {
	t.Parallel()
	cases := []struct {
		format  string
		json    bool
		refused bool
	}{{"", true, false}, {"json", true, false}, {"text", false, false}, {"yaml", false, true}}
	for _, c := range cases {
		t.Run(cmp.Or(c.format, "unset, not a terminal"), func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			log, err := newLogger(&buf, c.format, logging.Config{Level: slog.LevelInfo})
			if c.refused {
				require.ErrorContains(t, err, "LOG_FORMAT")
				return
			}
			require.NoError(t, err)
			log.Info("replication audit", "workspace", "w1")
			require.Equal(t, c.json, json.Valid(buf.Bytes()), "%s", buf.String())
			require.Contains(t, buf.String(), "w1")
		})
	}
}

// TestFailureSaysWhatHappened: the command's last line counts the failed
// workspaces truly, and an interrupted command says how to resume.
func TestFailureSaysWhatHappened(t *testing.T) {
	t.Parallel()
	ok := workspaceLine{Workspace: "w1", OK: true}
	bad := func(ws string) workspaceLine {
		return workspaceLine{Workspace: ws, Error: "the database is unavailable"}
	}
	cases := []struct {
		name        string
		lines       []workspaceLine
		interrupted bool
		shown       bool   // the causes are on the table above, on a terminal
		want        string // "" : no error
	}{
		{"all finished", []workspaceLine{ok}, false, false, ""},
		{"the one failed", []workspaceLine{bad("w2")}, false, false, "status failed for w2: the database is unavailable"},
		{"some failed", []workspaceLine{ok, bad("w2")}, false, false, "status failed for 1 of 2 workspaces (the others finished): w2: "},
		{"all failed", []workspaceLine{bad("w1"), bad("w2")}, false, false, "status failed for all 2 workspaces: w1: "},
		{"interrupted", []workspaceLine{ok, bad("w2")}, true, false, "status interrupted; everything done so far is committed: resume (1 of 2 workspaces not finished: w2)"},
		{"the one failed, its cause shown", []workspaceLine{bad("w2")}, false, true, "status failed for w2 (the cause is on its line above)"},
		{"some failed, their causes shown", []workspaceLine{ok, bad("w2")}, false, true, "status failed for 1 of 2 workspaces: w2 (each cause is on its line above)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := failure("status", c.lines, c.interrupted, "resume", c.shown)
			if c.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, c.want)
			if c.shown {
				require.NotContains(t, err.Error(), "unavailable", "a cause shown above is not printed again")
			}
		})
	}
}

// TestASilentDatabaseEndsACommandWithinItsBudget: against a server that
// accepts connections and never answers, a command ends within its retry
// budget and a second, whatever the connect timeout: a connect is given
// no longer than the budget, and no attempt starts that would end past it.
func TestASilentDatabaseEndsACommandWithinItsBudget(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // accepted, never answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	registry := fmt.Sprintf(`{"workspaces": [{"id": "w1", "database": {"url": "postgres://u@%s/db?sslmode=disable"},
		"pubsub": {"project": "p1", "topic": "events-w1"}, "bigquery": {"project": "p1", "location": "EU"}}]}`, l.Addr())
	getenv := func(k string) string {
		return map[string]string{"REPLICATION_WORKSPACES": registry, "PUBSUB_EMULATOR_HOST": "127.0.0.1:1"}[k]
	}
	for _, budget := range []time.Duration{2 * time.Second, 4 * time.Second} {
		t.Run(budget.String(), func(t *testing.T) {
			started := time.Now()
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), []string{"status", "--retry-budget", budget.String()}, getenv, &stdout, &stderr)
			took := time.Since(started)
			require.Error(t, err)
			require.Less(t, took, budget+time.Second, "a silent database held the command past its budget: %v", err)
		})
	}
}
