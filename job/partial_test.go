package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// eventIDs are the published event ids of a workspace's delivery rows that
// a condition on d (the delivery row) and p (the product history table's
// row, NULL for other events) picks.
func (h *harness) eventIDs(id, where string, args ...any) map[string]bool {
	h.t.Helper()
	rows, err := h.spaces[id].pool.Query(h.ctx, `SELECT d.event_id::text, t.source_id::text, t.generation::text
		FROM _ontology_replication_delivery d JOIN _ontology_replication_targets t USING (generation) WHERE `+where, args...)
	require.NoError(h.t, err)
	ids, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var ev, src, gen string
		err := r.Scan(&ev, &src, &gen)
		return event.ID(src, ev, gen), err
	})
	require.NoError(h.t, err)
	out := map[string]bool{}
	for _, e := range ids {
		out[e] = true
	}
	return out
}

// TestPartialReplay: `job replay --entity product --since-revision R`,
// while an SDK writer commits and the replay's own drains publish, is cut
// after part of what it sent back was published again; run again with the
// --accepted-before its error gives, it finishes without starting over.
// In the end every selected event (the products' events of revision R or
// later that existed when it began) was published again, and every other
// event — older products, the customers, the writer's new products — was
// published exactly once.
func TestPartialReplay(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	h.start("w1")
	h.products("w1", 6000)
	for range 5 {
		_, err := h.spaces["w1"].w.Create(h.ctx, "customer", map[string]any{"name": "c"})
		require.NoError(t, err)
	}
	h.mustRun("drain")
	h.mustRun("verify")
	customerTable := ""
	require.NoError(t, h.spaces["w1"].pool.QueryRow(h.ctx, `SELECT history_table FROM _ontology_replication_delivery
		ORDER BY revision DESC LIMIT 1`).Scan(&customerTable))
	var since int64
	require.NoError(t, h.spaces["w1"].pool.QueryRow(h.ctx, `SELECT revision FROM _ontology_replication_delivery
		WHERE history_table <> $1 ORDER BY revision OFFSET 1000 LIMIT 1`, customerTable).Scan(&since))
	selected := h.eventIDs("w1", "d.history_table <> $1 AND d.revision >= $2", customerTable, since)
	require.Len(t, selected, 5000)
	before := h.eventIDs("w1", "true")

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writes atomic.Int64
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := h.spaces["w1"].w.Create(h.ctx, "product", map[string]any{"title": "during the replay"}); !assert.NoError(t, err) {
				return
			}
			writes.Add(1)
		}
	})
	// Cut the first run once 500 selected events were published again.
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	var again atomic.Int64
	h.mu.Lock()
	h.onPublish = func(r *pubsubpb.PublishRequest) error {
		for _, m := range r.GetMessages() {
			var e event.Event
			if json.Unmarshal(m.GetData(), &e) == nil && selected[e.EventID] && again.Add(1) == 500 {
				cancel()
			}
		}
		return nil
	}
	h.mu.Unlock()
	args := []string{"replay", "--workspace", "w1", "--entity", "product", "--since-revision", fmt.Sprint(since)}
	out, logs, err := h.run(ctx, args...)
	h.mu.Lock()
	h.onPublish = nil
	h.mu.Unlock()
	require.ErrorContains(t, err, "replay interrupted", logs)
	require.ErrorContains(t, err, "--accepted-before its workspace's line gives")
	m := regexp.MustCompile(`--accepted-before (\S+)`).FindStringSubmatch(out)
	require.NotNil(t, m, "the workspace's line gives the bound: %s", out)
	bound := m[1]
	// The hint is the run's own bound, to the microsecond PostgreSQL
	// keeps: a rounded one would skip what was accepted in its last second.
	logged := regexp.MustCompile(`"accepted_before":"([^"]+)"`).FindStringSubmatch(logs)
	require.NotNil(t, logged, "the replay logs its bound: %s", logs)
	hinted, err := time.Parse(time.RFC3339Nano, bound)
	require.NoError(t, err)
	ran, err := time.Parse(time.RFC3339Nano, logged[1])
	require.NoError(t, err)
	require.True(t, ran.Equal(hinted), "the hint %s is the run's bound %s", bound, logged[1])

	out = h.mustRun(append(args, "--accepted-before", bound, "--json")...)
	var res struct {
		Workspaces []struct {
			Result struct {
				Rows      int `json:"rows"`
				Selection struct {
					AcceptedBefore string `json:"accepted_before"`
					SinceRevision  int64  `json:"since_revision"`
				} `json:"selection"`
			} `json:"result"`
		} `json:"workspaces"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Len(t, res.Workspaces, 1)
	require.Equal(t, since, res.Workspaces[0].Result.Selection.SinceRevision)
	require.Less(t, res.Workspaces[0].Result.Rows, 5000-400, "the rerun did not send back what the first had published again")
	close(stop)
	wg.Wait()
	require.Positive(t, writes.Load())

	h.mustRun("drain")
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"), "all rows end published")
	pub := h.published("w1")
	require.Len(t, pub, len(before)+int(writes.Load()))
	for id := range pub {
		if selected[id] {
			require.GreaterOrEqual(t, pub[id], 2, "a selected event is published again")
		} else {
			require.Equal(t, 1, pub[id], "an event outside the selection is published once")
		}
	}
	h.mustRun("verify")
	require.EqualValues(t, len(pub), h.count("w1", "SELECT verified_count FROM _ontology_replication_targets"))
}

// TestPartialReplayOfNothing: a replay whose selection holds no event
// exits non-zero and names what matched nothing; one with some records
// that matched nothing names them and succeeds.
func TestPartialReplayOfNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	h.start("w1")
	id, err := h.spaces["w1"].w.Create(h.ctx, "product", map[string]any{"title": "p"})
	require.NoError(t, err)
	h.mustRun("drain")

	_, logs, err := h.run(h.ctx, "replay", "--workspace", "w1", "--records", "junk")
	require.ErrorContains(t, err, "the replay's selection holds no event: records junk", logs)
	require.Equal(t, 1, exitCode(err))
	_, _, err = h.run(h.ctx, "replay", "--workspace", "w1", "--entity", "product", "--since-revision", "1000000")
	require.ErrorContains(t, err, "revision 1000000 or later")

	out := h.mustRun("replay", "--workspace", "w1", "--records", id+",junk")
	require.Contains(t, out, "1 event sent back to pending")
	require.Contains(t, out, "no event of these records was selected: junk")
}
