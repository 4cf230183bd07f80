package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// A blocker is a transaction of the test's own holding a lock that one page
// of a run waits on in the middle of its statement: the exact place to cut
// the run (terminate its backend: the page is rolled back), or to let it
// go after an interrupt (the page commits, and the run stops after it).
type blocker struct {
	t    *testing.T
	conn *pgx.Conn
	tx   pgx.Tx
	// watch looks at the database's sessions: outside the blocker's
	// transaction, whose view of pg_stat_activity would be a snapshot.
	watch *pgxpool.Pool
}

func (h *harness) blocker(t *testing.T, id, statement string, args ...any) *blocker {
	t.Helper()
	conn, err := pgx.Connect(h.ctx, h.spaces[id].url)
	require.NoError(t, err)
	tx, err := conn.Begin(h.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(h.ctx, statement, args...)
	require.NoError(t, err)
	b := &blocker{t: t, conn: conn, tx: tx, watch: h.spaces[id].pool}
	t.Cleanup(b.release)
	return b
}

// blockBackfillAt makes the backfill page that reaches the product
// history row of the given rank (0-based, in the pages' id order) wait
// inside its INSERT: the test inserts that row's delivery row first, in a
// transaction it keeps open, and ON CONFLICT waits for it.
func (h *harness) blockBackfillAt(t *testing.T, id string, rank int) *blocker {
	t.Helper()
	return h.blocker(t, id, `INSERT INTO _ontology_replication_delivery (generation, event_id, history_table, revision, is_baseline, next_verify_at)
		SELECT t.generation, h.id, 'product_history', (h.replication->>'revision')::bigint, false, now()
		FROM _ontology_replication_targets t, product_history h WHERE h.replication IS NOT NULL
		ORDER BY h.id OFFSET $1 LIMIT 1`, rank)
}

// blockReplayAt makes the replay page that reaches the delivery row of the
// given rank (0-based, in event id order) wait inside its reset: the test
// holds that row's lock.
func (h *harness) blockReplayAt(t *testing.T, id string, rank int) *blocker {
	t.Helper()
	return h.blocker(t, id, `SELECT 1 FROM _ontology_replication_delivery WHERE event_id =
		(SELECT event_id FROM _ontology_replication_delivery ORDER BY event_id OFFSET $1 LIMIT 1) FOR UPDATE`, rank)
}

// waiter waits until a page's statement waits on the blocker's lock and
// returns its backend's pid.
func (b *blocker) waiter() int32 {
	b.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var pid int32
		err := b.watch.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'WITH page AS%'`).Scan(&pid)
		if err == nil {
			return pid
		}
		require.ErrorIs(b.t, err, pgx.ErrNoRows)
		if time.Now().After(deadline) {
			rows, _ := b.watch.Query(context.Background(), `SELECT concat_ws(' | ', pid, state, wait_event_type, wait_event, left(query, 120))
				FROM pg_stat_activity WHERE datname = current_database()`)
			activity, _ := pgx.CollectRows(rows, pgx.RowTo[string])
			b.t.Fatalf("no page came to wait on the blocker; the database's sessions:\n%s", strings.Join(activity, "\n"))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// terminate ends a backend: its transaction is rolled back.
func (b *blocker) terminate(pid int32) {
	b.t.Helper()
	var done bool
	require.NoError(b.t, b.watch.QueryRow(context.Background(), "SELECT pg_terminate_backend($1)", pid).Scan(&done))
	require.True(b.t, done)
}

// release rolls the blocker back: the page waiting on it goes on.
func (b *blocker) release() {
	if b.conn.IsClosed() {
		return
	}
	_ = b.tx.Rollback(context.Background())
	_ = b.conn.Close(context.Background())
}

// cursor is a target's backfill or replay cursor.
func (h *harness) cursor(id, column string) string {
	h.t.Helper()
	var c string
	require.NoError(h.t, h.spaces[id].pool.QueryRow(h.ctx, "SELECT coalesce("+column+"::text, '') FROM _ontology_replication_targets").Scan(&c))
	return c
}

// productID is the product history id of a rank, in the backfill's order.
func (h *harness) productID(id string, rank int) string {
	h.t.Helper()
	var v string
	require.NoError(h.t, h.spaces[id].pool.QueryRow(h.ctx, `SELECT id::text FROM product_history WHERE replication IS NOT NULL
		ORDER BY id OFFSET $1 LIMIT 1`, rank).Scan(&v))
	return v
}

// deliveryID is the delivery row's event id of a rank, in the replay's
// order.
func (h *harness) deliveryID(id string, rank int) string {
	h.t.Helper()
	var v string
	require.NoError(h.t, h.spaces[id].pool.QueryRow(h.ctx, `SELECT event_id::text FROM _ontology_replication_delivery
		ORDER BY event_id OFFSET $1 LIMIT 1`, rank).Scan(&v))
	return v
}

// messages counts the messages a workspace's topic received.
func (h *harness) messages(id string) int {
	n := 0
	for _, m := range h.pubsub.Messages() {
		if m.Topic == "projects/p1/topics/events-"+id {
			n++
		}
	}
	return n
}

// runCut runs a command in the background and returns a wait for its end.
func (h *harness) runCut(ctx context.Context, replace map[string]string, args ...string) func() (string, error) {
	type result struct {
		logs string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		_, logs, err := h.runEnv(ctx, replace, args...)
		done <- result{logs, err}
	}()
	return func() (string, error) {
		r := <-done
		return r.logs, r.err
	}
}

// cutInside runs a command until one of its pages waits on b, terminates
// that page's backend (the page is rolled back) and returns the command's
// error; b still holds its lock. A lost connection is a transient fault
// the command retries; with the shortest retry budget its retry waits on
// b again until the lock timeout and the command then fails, as one killed
// mid-page would have.
func (h *harness) cutInside(b *blocker, args ...string) error {
	wait := h.runCut(h.ctx, map[string]string{"REPLICATION_RETRY_BUDGET": "1s"}, args...)
	b.terminate(b.waiter())
	_, err := wait()
	return err
}

// cutBetween runs a command until one of its pages waits on b, interrupts
// the command, lets that page go on (it commits; no other starts) and
// returns the command's error.
func (h *harness) cutBetween(b *blocker, args ...string) error {
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	wait := h.runCut(ctx, nil, args...)
	b.waiter()
	cancel()
	b.release()
	_, err := wait()
	return err
}

const backfillRows = 20 + 2500 // upgradedTemplate: baselines, then product history

// TestBackfillKillAndResume cuts a backfill at exact points — inside a
// page (its backend terminated mid-statement), between two pages (an
// interrupt while a page runs: that page commits, the next never starts),
// and during its drain — and checks what each cut left (the cursor, the
// rows), that the rerun says it resumed, and that it ends as an
// uninterrupted backfill does.
func TestBackfillKillAndResume(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &upgradedTemplate, &upgradedTemplate, &upgradedTemplate, &upgradedTemplate)
	h.mustRun("backfill", "--workspace", "w1")
	want := h.snapshot("w1")
	wantPublished := h.published("w1")
	rows := func(id string) int64 { return h.count(id, "SELECT count(*) FROM _ontology_replication_delivery") }
	// Pages: the 20 baselines, the customers' (none), then products
	// store.BackfillPageSize (1,000) at a time: the product of rank 1000
	// opens the second product page.
	cursorAfter := func(id string, products int) string {
		return fmt.Sprintf(`{"id": "%s", "table": 2}`, h.productID(id, products-1))
	}

	resume := func(t *testing.T, id, says string) {
		t.Helper()
		out := h.mustRun("backfill", "--workspace", id)
		require.Contains(t, out, says)
		require.Equal(t, want, h.snapshot(id), "%s ends as an uninterrupted run", id)
		require.Len(t, h.published(id), len(wantPublished), "%s: every event published", id)
	}

	t.Run("inside a page", func(t *testing.T) {
		b := h.blockBackfillAt(t, "w2", 1000)
		err := h.cutInside(b, "backfill", "--workspace", "w2")
		require.ErrorContains(t, err, "backfill failed for w2")
		require.Equal(t, cursorAfter("w2", 1000), h.cursor("w2", "backfill_cursor"), "the page that died left no trace")
		require.EqualValues(t, 20+1000, rows("w2"), "one page of products")
		b.release()
		resume(t, "w2", "(resumed)")
	})

	t.Run("between pages", func(t *testing.T) {
		b := h.blockBackfillAt(t, "w3", 1000)
		err := h.cutBetween(b, "backfill", "--workspace", "w3")
		require.ErrorContains(t, err, "backfill interrupted; everything done so far is committed: run the same command again to resume")
		require.Equal(t, cursorAfter("w3", 2000), h.cursor("w3", "backfill_cursor"), "the page running at the interrupt committed; no other began")
		require.EqualValues(t, 20+2000, rows("w3"))
		resume(t, "w3", "(resumed)")
	})

	t.Run("during the drain", func(t *testing.T) {
		// The interrupt arrives while the drain publishes, once the pages
		// are done: they take turns with the drain every
		// delivery.DrainEveryPages pages, more than this backfill has, so
		// the drain publishes after the last. The interrupt is the first
		// publish request from the 300th event on.
		require.Less(t, backfillRows/1000+3, delivery.DrainEveryPages, "the backfill's pages (baselines, customers, products) come before its drain")
		ctx, cancel := context.WithCancel(h.ctx)
		defer cancel()
		var sent atomic.Int64
		var interrupt sync.Once
		h.mu.Lock()
		h.onPublish = func(r *pubsubpb.PublishRequest) error {
			if r.GetTopic() == "projects/p1/topics/events-w4" && sent.Add(int64(len(r.GetMessages()))) >= 300 {
				interrupt.Do(cancel)
			}
			return nil
		}
		h.mu.Unlock()
		_, _, err := h.run(ctx, "backfill", "--workspace", "w4")
		h.mu.Lock()
		h.onPublish = nil
		h.mu.Unlock()
		require.ErrorContains(t, err, "run the same command again to resume")
		require.Less(t, h.count("w4", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL"), int64(backfillRows))
		resume(t, "w4", ": 0 pages, 0 rows; published") // the pages were done: only the drain runs
	})
}

// replayHarness is a protocol-4 workspace with 2,500 events published and
// verified: a replay of three pages (1,000 rows each) to do.
func replayHarness(t *testing.T, n int) *harness {
	t.Helper()
	templates := make([]*pgtest.Template, n)
	for i := range templates {
		templates[i] = &sdkfixture.V4Template
	}
	h := newHarness(t, templates...)
	for id := range h.spaces {
		h.start(id)
		h.products(id, 2500)
	}
	h.mustRun("drain")
	h.mustRun("verify")
	return h
}

// TestReplayKillAndResume cuts a replay inside a page, between pages and
// after its pages but before its drain finished: each rerun resumes (the
// last only drains: no row is reset again), and each ends with every event
// published again.
func TestReplayKillAndResume(t *testing.T) {
	t.Parallel()
	h := replayHarness(t, 3)
	for id := range h.spaces {
		require.EqualValues(t, 0, h.count(id, "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NULL"), "%s verified", id)
	}
	resume := func(t *testing.T, id string) {
		t.Helper()
		before := h.messages(id)
		out := h.mustRun("replay", "--workspace", id)
		require.Contains(t, out, "(resumed)")
		require.Zero(t, h.count(id, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"), "%s: every event published again", id)
		require.Positive(t, h.messages(id)-before)
	}

	t.Run("inside a page", func(t *testing.T) {
		// Initialisation, then the first page; the second waits on the
		// row of rank 1000 and dies.
		b := h.blockReplayAt(t, "w1", 1000)
		err := h.cutInside(b, "replay", "--workspace", "w1")
		require.ErrorContains(t, err, "replay failed for w1")
		require.Equal(t, h.deliveryID("w1", 999), h.cursor("w1", "replay_cursor"), "the page that died left no trace")
		require.EqualValues(t, 0, h.count("w1", `SELECT count(*) FROM _ontology_replication_delivery
			WHERE event_id > $1::uuid AND accepted_at IS NULL`, h.deliveryID("w1", 999)), "no row past the first page was reset")
		b.release()
		resume(t, "w1")
	})

	t.Run("between pages", func(t *testing.T) {
		b := h.blockReplayAt(t, "w2", 1000)
		err := h.cutBetween(b, "replay", "--workspace", "w2")
		require.ErrorContains(t, err, "replay interrupted; everything done so far is committed: run the same command again to resume")
		require.Equal(t, h.deliveryID("w2", 1999), h.cursor("w2", "replay_cursor"), "the page running at the interrupt committed; no other began")
		resume(t, "w2")
	})

	t.Run("after its pages, during its drain", func(t *testing.T) {
		ctx, cancel := context.WithCancel(h.ctx)
		defer cancel()
		var complete atomic.Bool
		h.mu.Lock()
		h.onPublish = func(r *pubsubpb.PublishRequest) error {
			if r.GetTopic() != "projects/p1/topics/events-w3" {
				return nil
			}
			if !complete.Load() && h.count("w3", "SELECT count(*) FROM _ontology_replication_targets WHERE replay_complete") == 1 {
				complete.Store(true)
				cancel()
			}
			return nil
		}
		h.mu.Unlock()
		_, _, err := h.run(ctx, "replay", "--workspace", "w3")
		h.mu.Lock()
		h.onPublish = nil
		h.mu.Unlock()
		require.ErrorContains(t, err, "run the same command again to resume")
		require.True(t, complete.Load(), "cut after the last page")
		pending := h.count("w3", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL")
		accepted := h.count("w3", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL")
		require.Positive(t, pending)
		require.Positive(t, accepted, "some replayed events were published before the cut")
		before := h.messages("w3")
		out, logs, err := h.run(h.ctx, "replay", "--workspace", "w3")
		require.NoError(t, err, logs)
		require.Contains(t, out, "(resumed)")
		require.Contains(t, logs, "replication: resuming the replay whose pages are done: draining its events")
		require.EqualValues(t, pending, h.messages("w3")-before, "the rerun only drained what was pending: nothing reset again")
		require.Zero(t, h.count("w3", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
	})
}

// jobBinary builds the job once per test run.
func jobBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "job")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

// TestSignalsToTheJobProcess sends SIGTERM to the job's process (not a
// cancelled context) while a backfill page runs: once, and the process
// finishes that page, stops, says how to resume and exits 1; twice, and it
// exits 130 at once, the page rolled back by the server, saying so.
func TestSignalsToTheJobProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the job")
	}
	t.Parallel()
	bin := jobBinary(t)
	h := newHarness(t, &upgradedTemplate, &upgradedTemplate)
	rows := func(id string) int64 { return h.count(id, "SELECT count(*) FROM _ontology_replication_delivery") }
	// start starts the job; stopping is closed when it says it will stop
	// after the current page (a second signal sent before could merge with
	// the first: the kernel keeps one pending SIGTERM).
	// wait returns the process's end once its stderr is read to the end.
	start := func(t *testing.T, id string) (cmd *exec.Cmd, stderr *syncBuffer, stopping chan struct{}, wait func() error) {
		cmd = exec.Command(bin, "backfill", "--workspace", id)
		cmd.Env = append(os.Environ(), "REPLICATION_WORKSPACES="+h.env["REPLICATION_WORKSPACES"], "PUBSUB_EMULATOR_HOST="+h.env["PUBSUB_EMULATOR_HOST"])
		pipe, err := cmd.StderrPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		stderr, stopping = &syncBuffer{}, make(chan struct{})
		read := make(chan struct{})
		go func() {
			defer close(read)
			lines := bufio.NewScanner(pipe)
			for lines.Scan() {
				fmt.Fprintln(stderr, lines.Text())
				if strings.Contains(lines.Text(), "stopping after the current page") {
					close(stopping)
				}
			}
		}()
		return cmd, stderr, stopping, func() error { <-read; return cmd.Wait() }
	}
	exitCode := func(err error) int {
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "%v", err)
		return exit.ExitCode()
	}

	t.Run("once", func(t *testing.T) {
		b := h.blockBackfillAt(t, "w1", 1000)
		cmd, stderr, stopping, wait := start(t, "w1")
		defer func() {
			if t.Failed() {
				t.Log(stderr.String())
			}
		}()
		b.waiter()
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		<-stopping
		b.release()
		err := wait()
		require.Equal(t, 1, exitCode(err), stderr.String())
		require.Contains(t, stderr.String(), "stopping after the current page")
		require.Contains(t, stderr.String(), "backfill interrupted; everything done so far is committed: run the same command again to resume")
		require.EqualValues(t, 20+2000, rows("w1"), "the page running at the signal committed; no other began")
	})

	t.Run("twice", func(t *testing.T) {
		b := h.blockBackfillAt(t, "w2", 1000)
		cmd, stderr, stopping, wait := start(t, "w2")
		pid := b.waiter()
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		<-stopping
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		err := wait()
		require.Equal(t, 130, exitCode(err), stderr.String())
		require.Contains(t, stderr.String(), "stopped at once: the pages and batches in flight were rolled back")
		// The process is gone; its page ends when the server sees the
		// connection close, and is rolled back.
		var gone bool
		for !gone {
			require.NoError(t, b.watch.QueryRow(h.ctx, "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&gone))
			time.Sleep(5 * time.Millisecond)
		}
		b.release()
		require.EqualValues(t, 20+1000, rows("w2"), "the page in flight left nothing")
	})
}
