package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
