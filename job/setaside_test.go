package main

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// refuse makes Pub/Sub refuse (INVALID_ARGUMENT) every request holding a
// message that contains mark, while on; it counts the requests that held
// one.
type refusal struct {
	on       atomic.Bool
	requests atomic.Int64 // requests holding a marked message
}

func (h *harness) refuse(mark string) *refusal {
	r := &refusal{}
	r.on.Store(true)
	h.mu.Lock()
	h.onPublish = func(req *pubsubpb.PublishRequest) error {
		for _, m := range req.GetMessages() {
			if strings.Contains(string(m.Data), mark) {
				r.requests.Add(1)
				if r.on.Load() {
					return status.Error(codes.InvalidArgument, "refused: "+mark)
				}
				return nil
			}
		}
		return nil
	}
	h.mu.Unlock()
	return r
}

func (h *harness) statusJSON(args ...string) []workspaceStatus {
	h.t.Helper()
	var all []workspaceStatus
	require.NoError(h.t, json.Unmarshal([]byte(h.mustRun(append([]string{"status", "--json"}, args...)...)), &all))
	return all
}

// TestOneRefusedEventAmongMany: Pub/Sub refuses one event in the middle of
// 1,500 pending: `job drain` publishes every other one and ends; finding it
// cost at most 2 + ⌈log₂ 100⌉ requests; another process's `job status
// --json` names it; once Pub/Sub takes it, `job set-aside --retry` and a
// drain deliver it.
func TestOneRefusedEventAmongMany(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	h.start("w1")
	h.products("w1", 750)
	_, err := h.spaces["w1"].w.Create(h.ctx, "product", map[string]any{"title": "REFUSED"})
	require.NoError(t, err)
	h.products("w1", 749)
	r := h.refuse("REFUSED")

	out := h.mustRun("drain")
	require.Contains(t, out, "published 1499 events, set aside 1")
	require.LessOrEqual(t, r.requests.Load(), int64(2+7), "bisection, not a request per event")
	require.EqualValues(t, 1, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))

	s := h.statusJSON()[0]
	require.EqualValues(t, 1, s.SetAside.Count)
	require.Len(t, s.SetAside.Events, 1)
	ev := s.SetAside.Events[0]
	require.Equal(t, string(store.ReasonRejected), ev.Reason)
	require.Equal(t, "product_history", ev.HistoryTable)
	require.EqualValues(t, 1, h.count("w1", `SELECT count(*) FROM product_history WHERE id = $1::uuid AND replication->>'payload' LIKE '%REFUSED%'`, ev.HistoryID))

	// Drains within the backoff do not send it again.
	before := r.requests.Load()
	h.mustRun("drain")
	require.Equal(t, before, r.requests.Load())

	r.on.Store(false)
	out = h.mustRun("set-aside", "--retry")
	require.Contains(t, out, "retried: 1 event")
	h.mustRun("drain")
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
	require.Zero(t, h.statusJSON()[0].SetAside.Count)
}

// TestManyRefusedEvents: Pub/Sub refuses 1,200 events (a schema attached to
// the topic): `job drain` ends, having set them all aside at a bounded cost
// in requests, and a second drain within the backoff sends none of them.
func TestManyRefusedEvents(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	h.start("w1")
	h.products("w1", 1200)
	r := h.refuse(`"entity_id":"ent_product"`)
	ctx, cancel := context.WithTimeout(h.ctx, time.Minute)
	defer cancel()
	out, logs, err := h.run(ctx, "drain")
	require.NoError(t, err, logs)
	require.Contains(t, out, "published 0 events, set aside 1200")
	require.LessOrEqual(t, r.requests.Load(), int64(12*(2*100+7+2)), "at most 2n + log₂ n + 2 requests a batch")
	before := r.requests.Load()
	h.mustRun("drain")
	require.Equal(t, before, r.requests.Load(), "none sent again within the backoff")
	require.EqualValues(t, 1200, h.statusJSON()[0].SetAside.Count)
	// One error line per batch (concurrent drains may claim a batch in two
	// parts), not per event or per request; together they name every event.
	lines, named := 0, 0
	for _, line := range strings.Split(logs, "\n") {
		var entry struct {
			Message string `json:"message"`
			Count   int    `json:"count"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Message == delivery.LogEventsSetAside {
			lines++
			named += entry.Count
		}
	}
	require.Equal(t, 1200, named, "the error lines name every event set aside")
	require.GreaterOrEqual(t, lines, 12)
	require.LessOrEqual(t, lines, 12+4, "a line per batch: 12 batches, or a few more where concurrent drains split one")
}

// TestUnpublishableRowsAtTheHead: a missing history row and a delivery row
// naming a table without a capture trigger at the head of the queue: the
// events behind them are delivered, and status names both with their
// reasons.
func TestUnpublishableRowsAtTheHead(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	h.start("w1")
	h.products("w1", 300)
	pool := h.spaces["w1"].pool
	for _, q := range []string{
		"DELETE FROM product_history WHERE id = (SELECT event_id FROM _ontology_replication_delivery ORDER BY revision LIMIT 1)",
		"UPDATE _ontology_replication_delivery SET history_table = 'gone_history' WHERE event_id = (SELECT event_id FROM _ontology_replication_delivery ORDER BY revision OFFSET 1 LIMIT 1)",
	} {
		_, err := pool.Exec(h.ctx, q)
		require.NoError(t, err)
	}
	out := h.mustRun("drain")
	require.Contains(t, out, "published 298 events, set aside 2")
	s := h.statusJSON()[0]
	reasons := map[string]int{}
	for _, ev := range s.SetAside.Events {
		reasons[ev.Reason]++
	}
	require.Equal(t, map[string]int{string(store.ReasonMissingHistory): 1, string(store.ReasonUnknownTable): 1}, reasons)
	table := h.mustRun("status")
	require.Contains(t, table, "missing_history")
	require.Contains(t, table, "gone_history")
}

// TestDeadLetterCommand: the messages the BigQuery subscription moved to
// the dead letter are listed by event, left in place, counted by `job
// status` with the oldest one's age; --discard --events removes the
// messages of the chosen event only and logs it; --republish publishes the
// rest to the events topic again and removes them.
func TestDeadLetterCommand(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V4Template)
	h.start("w1")
	dead := "projects/p1/topics/events-w1-dead-letter"
	// Two copies of an event dead-lettered after five attempts each (the
	// event was republished once), and one of another, as Pub/Sub forwards
	// them.
	data := `{"event_id":"e-dead","record_key":"k1","entity_id":"ent_product","revision":"41"}`
	other := `{"event_id":"e-other","record_key":null}`
	for _, d := range []string{data, data, other} {
		_, err := h.pubsub.GServer.Publish(h.ctx, &pubsubpb.PublishRequest{Topic: dead, Messages: []*pubsubpb.PubsubMessage{{
			Data: []byte(d), Attributes: map[string]string{"CloudPubSubDeadLetterSourceDeliveryCount": "5"}}}})
		require.NoError(t, err)
	}
	published := time.Now()
	out := h.mustRun("dead-letter", "--workspace", "w1")
	require.Contains(t, out, "3 messages, 2 events")
	require.Contains(t, out, "event e-dead  product k1  2 copies, 5 delivery attempts")
	out = h.mustRun("dead-letter", "--workspace", "w1", "--json")
	var doc struct {
		Workspaces []struct {
			Result delivery.DeadLetterReport `json:"result"`
		} `json:"workspaces"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	require.Equal(t, 3, doc.Workspaces[0].Result.Messages, "listing leaves them in place")
	require.True(t, doc.Workspaces[0].Result.Complete)

	before := time.Now()
	s := statusOf(t, h, "--workspace", "w1")[0]
	require.Empty(t, s.DeadLetterError)
	require.Equal(t, 3, s.Messages, "job status counts the dead letters")
	require.False(t, s.Capped)
	require.LessOrEqual(t, s.OldestAgeSeconds, time.Since(published).Seconds()+1)
	require.GreaterOrEqual(t, s.OldestAgeSeconds, before.Sub(published).Seconds()-1)

	out, logs, err := h.run(h.ctx, "dead-letter", "--workspace", "w1", "--discard", "--events", "e-dead,e-gone")
	require.NoError(t, err, logs)
	require.Contains(t, out, "discarded 2 messages")
	require.Contains(t, out, "not among the messages read: e-gone")
	require.Contains(t, logs, delivery.LogDeadLetterDiscarded)
	require.Contains(t, logs, `"event_id":"e-dead"`)
	require.Contains(t, logs, `"record_key":"k1"`)
	require.NotContains(t, logs, `"event_id":"e-other"`, "only the chosen event is discarded")
	out = h.mustRun("dead-letter", "--workspace", "w1")
	require.Contains(t, out, "1 message, 1 event")
	require.Contains(t, out, "event e-other")

	out = h.mustRun("dead-letter", "--workspace", "w1", "--republish")
	require.Contains(t, out, "republished 1 message")
	republished := 0
	for _, m := range h.pubsub.Messages() {
		if m.Topic == "projects/p1/topics/events-w1" && (string(m.Data) == other || string(m.Data) == data) {
			require.Equal(t, other, string(m.Data), "the discarded event is not republished")
			republished++
		}
	}
	require.Equal(t, 1, republished)
	require.Contains(t, h.mustRun("dead-letter", "--workspace", "w1"), "0 messages, 0 events")
	require.Zero(t, statusOf(t, h, "--workspace", "w1")[0].Messages)

	_, _, err = h.run(h.ctx, "dead-letter", "--workspace", "w1", "--events", "e-dead")
	require.ErrorContains(t, err, "--events chooses what --republish or --discard acts on")
	require.Equal(t, 2, exitCode(err))
}

// TestProtocol3SetAsideIsSaidToBeLocal: at protocol 3 the set-aside
// events live in the memory of the process that set them aside; job status
// and job set-aside say so instead of reporting none.
func TestProtocol3SetAsideIsSaidToBeLocal(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &sdkfixture.V3Template)
	h.start("w1")
	s := statusOf(t, h, "--workspace", "w1")[0]
	require.True(t, s.SetAside.NotShared)
	require.Equal(t, delivery.NoteSetAsideNotShared, s.SetAside.Note)
	table := h.mustRun("status", "--workspace", "w1")
	require.Contains(t, table, "n/a (protocol 3)")
	require.Contains(t, table, "protocol 3 keeps set-aside events in the memory")
	require.Contains(t, h.mustRun("set-aside", "--workspace", "w1"), "set-aside events unknown here")
}
