package localwarehouse_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/testbench/localwarehouse"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func wire(e event.Event) []byte { return e.AppendJSON(nil) }

func sample(key, kind, revision string, deleted bool, payload string) event.Event {
	return event.Event{EventID: event.ID("s", key+revision, "g"), SourceID: "s", Generation: "g", EntityID: "ent_product",
		RecordKey: key, RecordKind: kind, Revision: revision, Deleted: deleted, SchemaHash: "h", Payload: payload}
}

func TestLocalIngestFollowsTheTableSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, err := localwarehouse.Open(ctx, pgtest.NewDatabase(t, nil))
	require.NoError(t, err)
	defer l.Close()
	good := string(wire(sample("k1", "entity", "7", false, `{"id":"k1"}`)))
	cases := []struct {
		name, msg, want string
	}{
		{"valid", good, ""},
		{"unknown field is dropped", strings.Replace(good, `{"event_id"`, `{"extra":{"x":1},"event_id"`, 1), ""},
		{"missing required field", strings.Replace(good, `"schema_hash":"h",`, "", 1), "required field schema_hash is missing"},
		{"payload not JSON", strings.Replace(good, `"payload":"{\"id\":\"k1\"}"`, `"payload":"{oops"`, 1), "payload is not a string holding JSON"},
		{"payload not a string", strings.Replace(good, `"payload":"{\"id\":\"k1\"}"`, `"payload":{"id":"k1"}`, 1), "payload"},
		{"revision not numeric", strings.Replace(good, `"revision":"7"`, `"revision":"seven"`, 1), "revision"},
		{"deleted as a string", strings.Replace(good, `"deleted":false`, `"deleted":"false"`, 1), "deleted is not a boolean"},
		{"not an object", `[1]`, "not a JSON object"},
	}
	for _, c := range cases {
		require.NotEqual(t, c.name != "valid", c.msg == good, c.name)
		err := l.Ingest(ctx, [][]byte{[]byte(c.msg)})
		if c.want == "" {
			require.NoError(t, err, c.name)
			continue
		}
		require.ErrorIs(t, err, localwarehouse.ErrRejected, c.name)
		require.ErrorContains(t, err, c.want, c.name)
	}
	var n int
	var revision string
	require.NoError(t, l.Pool().QueryRow(ctx, "SELECT count(*), min(revision)::text FROM events").Scan(&n, &revision))
	require.Equal(t, 2, n)
	require.Equal(t, "7", revision)
}

// TestLocalFeederDeadLetters runs the feeder on pstest: a message that does
// not fit is refused, redelivered, then dead-lettered; the others land.
func TestLocalFeederDeadLetters(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := pstest.NewServer()
	defer srv.Close()
	client, err := pubsub.NewClient(ctx, "p1", pubsubOpts(srv)...)
	require.NoError(t, err)
	defer client.Close()
	for _, topic := range []string{"projects/p1/topics/events", "projects/p1/topics/dead"} {
		_, err := client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic})
		require.NoError(t, err)
	}
	_, err = client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: "projects/p1/subscriptions/bq",
		Topic: "projects/p1/topics/events", AckDeadlineSeconds: 60})
	require.NoError(t, err)
	_, err = client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: "projects/p1/subscriptions/dead", Topic: "projects/p1/topics/dead"})
	require.NoError(t, err)

	l, err := localwarehouse.Open(ctx, pgtest.NewDatabase(t, nil))
	require.NoError(t, err)
	defer l.Close()
	bad := []byte(`{"event_id":"x","deleted":false}`)
	_, err = client.TopicAdminClient.Publish(ctx, &pubsubpb.PublishRequest{Topic: "projects/p1/topics/events", Messages: []*pubsubpb.PubsubMessage{
		{Data: wire(sample("k1", "entity", "1", false, `{}`))}, {Data: bad}, {Data: wire(sample("k2", "entity", "2", false, `{}`))}}})
	require.NoError(t, err)
	f := &localwarehouse.Feeder{Client: client, Subscription: "projects/p1/subscriptions/bq", Warehouse: l, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		DeadLetterTopic: "projects/p1/topics/dead", MaxDeliveries: 5}
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(fctx) }()
	var dead *pubsubpb.PullResponse
	require.Eventually(t, func() bool {
		dead, err = client.SubscriptionAdminClient.Pull(ctx, &pubsubpb.PullRequest{Subscription: "projects/p1/subscriptions/dead", MaxMessages: 10, ReturnImmediately: true})
		return err == nil && len(dead.ReceivedMessages) == 1
	}, 20*time.Second, 50*time.Millisecond)
	// The dead letter can be pulled before the feeder's publish of it has
	// returned: its own count is the signal that it moved the message.
	require.Eventually(t, func() bool { return f.DeadLettered() == 1 }, 20*time.Second, 10*time.Millisecond, "the feeder counts the message it moved")
	stop()
	require.NoError(t, <-done)
	require.Equal(t, string(bad), string(dead.ReceivedMessages[0].Message.Data))
	require.Equal(t, "5", dead.ReceivedMessages[0].Message.Attributes["CloudPubSubDeadLetterSourceDeliveryCount"])
	require.EqualValues(t, 2, f.Written())
	// Refused on each of the 4 deliveries before the dead letter (the 5th,
	// as its attribute says). On a saturated machine the emulator may hand
	// the message out once more before the feeder's acknowledgement of the
	// move reaches it, and that delivery is refused too: at least 4.
	require.GreaterOrEqual(t, f.Refused(), int64(4), "refused on each delivery before the dead letter")
	require.EqualValues(t, 1, f.DeadLettered())
	// Gone from the subscription: acknowledged once moved, as Pub/Sub does.
	left, err := client.SubscriptionAdminClient.Pull(ctx, &pubsubpb.PullRequest{Subscription: "projects/p1/subscriptions/bq", MaxMessages: 10, ReturnImmediately: true})
	require.NoError(t, err)
	require.Empty(t, left.ReceivedMessages)
}

func TestLocalViewsMatchTheModel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, err := localwarehouse.Open(ctx, pgtest.NewDatabase(t, nil))
	require.NoError(t, err)
	defer l.Close()
	tg := demoTarget(t, sdkfixture.Demo, sdkfixture.Demo.FullSelection())
	ev := func(key, kind, rev string, deleted bool, payload map[string]any) []byte {
		raw, _ := json.Marshal(payload)
		e := sample(key, kind, rev, deleted, string(raw))
		e.Generation, e.SourceID = tg.Generation, tg.SourceID
		if kind != "entity" {
			e.EntityID = "ent_order"
		}
		return wire(e)
	}
	require.NoError(t, l.Ingest(ctx, [][]byte{
		ev("p1", "entity", "1", false, map[string]any{"id": "p1", "title": "old", "stock": "3", "price": 1.5}),
		ev("p1", "entity", "5", false, map[string]any{"id": "p1", "title": "new", "stock": "4", "price": 2.5}),
		ev("p1", "entity", "5", false, map[string]any{"id": "p1", "title": "new", "stock": "4", "price": 2.5}), // a duplicate
		ev("p2", "entity", "2", false, map[string]any{"id": "p2", "title": "gone", "stock": "x"}),
		ev("p2", "entity", "6", true, map[string]any{}),
		ev("o1:p1", "edge:products", "3", false, map[string]any{"source_id": "o1", "target_id": "p1"}),
	}))
	names, err := l.CreateViews(ctx, registry.Workspace{}, delivery.ViewsTarget(tg))
	require.NoError(t, err)
	require.Equal(t, []string{"customer", "product", "order", "order_products"}, names)
	var title string
	var stock int64
	var price float64
	var n int
	require.NoError(t, l.Pool().QueryRow(ctx, `SELECT count(*) OVER (), title, stock, price FROM product`).Scan(&n, &title, &stock, &price))
	require.Equal(t, 1, n, "the latest row of each record, tombstones removed, duplicates absorbed")
	require.Equal(t, "new", title)
	require.EqualValues(t, 4, stock)
	require.Equal(t, 2.5, price)
	var src, dst string
	require.NoError(t, l.Pool().QueryRow(ctx, `SELECT source_id, target_id FROM order_products`).Scan(&src, &dst))
	require.Equal(t, []string{"o1", "p1"}, []string{src, dst})
}
