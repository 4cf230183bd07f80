package delivery_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
)

// TestDeadLetters: the dead-lettered messages are reported by event (two
// copies of one event, one of another, one message that is not an event),
// and listing leaves them in place; Discard removes only the chosen
// events' messages and names the ids it did not find; Republish publishes
// the rest to the events topic and removes them.
func TestDeadLetters(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4)
	dead := "projects/p1/topics/events-dead-letter"
	_, err := r.srv.GServer.CreateTopic(r.ctx, &pubsubpb.Topic{Name: dead})
	require.NoError(t, err)
	_, err = r.srv.GServer.CreateSubscription(r.ctx, &pubsubpb.Subscription{Name: "projects/p1/subscriptions/events-dead-letter",
		Topic: dead, AckDeadlineSeconds: 60})
	require.NoError(t, err)
	event := `{"event_id":"e-dead","record_key":"k1","entity_id":"ent_product","revision":41}`
	other := `{"event_id":"e-other","record_key":null}`
	for i, d := range []string{event, event, other, "not json"} {
		_, err := r.srv.GServer.Publish(r.ctx, &pubsubpb.PublishRequest{Topic: dead, Messages: []*pubsubpb.PubsubMessage{{
			Data: []byte(d), Attributes: map[string]string{"CloudPubSubDeadLetterSourceDeliveryCount": []string{"5", "7", "5", "5"}[i]}}}})
		require.NoError(t, err)
	}

	rep, err := r.svc.DeadLetters(r.ctx, "w1", delivery.DeadLetterOptions{Budget: 20 * time.Second})
	require.NoError(t, err)
	require.Equal(t, 4, rep.Messages, "%+v", rep)
	require.True(t, rep.Complete)
	require.NotNil(t, rep.Oldest)
	require.Len(t, rep.Events, 3)
	byID := map[string]delivery.DeadLetteredEvent{}
	for _, e := range rep.Events {
		byID[e.EventID] = e
	}
	e := byID["e-dead"]
	require.Equal(t, 2, e.Copies)
	require.Equal(t, 7, e.DeliveryAttempts, "the most attempts of one copy")
	require.Equal(t, []string{"ent_product", "product", "k1", "41"}, []string{e.EntityID, e.Entity, e.RecordKey, e.Revision}, "the entity by id and by name")
	require.Equal(t, 1, byID["e-other"].Copies)
	require.True(t, slices.ContainsFunc(rep.Events, func(e delivery.DeadLetteredEvent) bool { return strings.Contains(e.EventID, "not an event") }))

	rep, err = r.svc.DeadLetters(r.ctx, "w1", delivery.DeadLetterOptions{Budget: 20 * time.Second, Discard: true, Events: []string{"e-dead", "e-gone"}})
	require.NoError(t, err)
	require.Equal(t, 2, rep.Discarded)
	require.Equal(t, []string{"e-gone"}, rep.NotFound)

	before := len(r.srv.Messages())
	rep, err = r.svc.DeadLetters(r.ctx, "w1", delivery.DeadLetterOptions{Budget: 20 * time.Second, Republish: true})
	require.NoError(t, err)
	require.Equal(t, 2, rep.Republished, "what was not discarded")
	var republished []string
	for _, m := range r.srv.Messages()[before:] {
		require.Equal(t, "projects/p1/topics/events", m.Topic)
		republished = append(republished, string(m.Data))
	}
	require.ElementsMatch(t, []string{other, "not json"}, republished)

	rep, err = r.svc.DeadLetters(r.ctx, "w1", delivery.DeadLetterOptions{Budget: 20 * time.Second})
	require.NoError(t, err)
	require.Zero(t, rep.Messages, "nothing left")
}
