package localwarehouse

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// Feeder feeds the local warehouse from a Pub/Sub subscription the way a
// BigQuery subscription feeds BigQuery: pull, write what fits, acknowledge
// it; refuse (nack) what does not fit, so that Pub/Sub redelivers it and,
// after MaxDeliveries attempts, moves it to DeadLetterTopic.
//
// The feeder does that move itself, as Pub/Sub's dead-letter policy does:
// it publishes the message to the dead-letter topic with the
// CloudPubSubDeadLetterSourceDeliveryCount attribute and acknowledges it.
// pstest's own policy forwards the message but cannot remove it from the
// subscription once it was nacked (its pull acknowledges it by message id,
// where a nacked message accepts no acknowledgement), so it forwards it
// again on every pull, and a discarded dead letter would come back.
type Feeder struct {
	Client       *pubsub.Client
	Subscription string // full name
	Warehouse    *Local
	Logger       *slog.Logger
	// Refuse, when set, makes the feeder refuse messages it returns true
	// for, as if they did not fit the table (the local mode uses it to send
	// one event to the dead letter).
	Refuse func(data []byte) bool
	// DeadLetterTopic (full name) receives the messages refused
	// MaxDeliveries times (default 5); empty: refused messages are
	// redelivered for ever.
	DeadLetterTopic string
	MaxDeliveries   int
	// Stalled, when set and true, holds the feeding (nothing is pulled),
	// as a BigQuery subscription that lags: the chaos run's stall.
	Stalled func() bool

	written, refused, deadLettered atomic.Int64
	// writeFailed counts the messages nacked because their write failed
	// (redelivered, as a BigQuery subscription retries).
	writeFailed atomic.Int64
	deliveries  map[string]int // refused message id → deliveries so far
}

// DeadLettered is how many messages were moved to the dead-letter topic.
func (f *Feeder) DeadLettered() int64 { return f.deadLettered.Load() }

// Written is how many messages were written to the table.
func (f *Feeder) Written() int64 { return f.written.Load() }

// Refused is how many deliveries were refused (nacked) because they did
// not fit.
func (f *Feeder) Refused() int64 { return f.refused.Load() }

// WriteFailed is how many deliveries were nacked because their write
// failed (a busy database); they are redelivered.
func (f *Feeder) WriteFailed() int64 { return f.writeFailed.Load() }

// Run feeds until ctx ends.
func (f *Feeder) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		if f.Stalled != nil && f.Stalled() {
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		resp, err := f.Client.SubscriptionAdminClient.Pull(ctx, &pubsubpb.PullRequest{Subscription: f.Subscription, MaxMessages: 500})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			f.Logger.Warn("local warehouse: pull failed", slog.Any("error", err))
			time.Sleep(200 * time.Millisecond)
			continue
		}
		var fit [][]byte
		var ack, nack, fitAcks []string
		for _, m := range resp.ReceivedMessages {
			data := m.GetMessage().GetData()
			if _, err := decode(data); err != nil || (f.Refuse != nil && f.Refuse(data)) {
				if f.deadLetter(ctx, m) {
					ack = append(ack, m.AckId)
					continue
				}
				nack = append(nack, m.AckId)
				f.refused.Add(1)
				continue
			}
			fit = append(fit, data)
			fitAcks = append(fitAcks, m.AckId)
		}
		if len(fit) > 0 {
			if err := f.Warehouse.Ingest(ctx, fit); err != nil {
				if errors.Is(err, context.Canceled) {
					return nil
				}
				// Only the messages written are redelivered: one moved to
				// the dead-letter topic is acknowledged all the same.
				f.Logger.Warn("local warehouse: write failed; the messages will be redelivered", slog.Any("error", err))
				f.writeFailed.Add(int64(len(fit)))
				nack = append(nack, fitAcks...)
			} else {
				f.written.Add(int64(len(fit)))
				ack = append(ack, fitAcks...)
			}
		}
		if len(ack) > 0 {
			_ = f.Client.SubscriptionAdminClient.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: f.Subscription, AckIds: ack})
		}
		if len(nack) > 0 {
			_ = f.Client.SubscriptionAdminClient.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{
				Subscription: f.Subscription, AckIds: nack, AckDeadlineSeconds: 0})
		}
	}
	return nil
}

// deadLetter counts a refused delivery of m and, at the last attempt,
// publishes m to the dead-letter topic; it reports whether it did (m is
// then to be acknowledged).
func (f *Feeder) deadLetter(ctx context.Context, m *pubsubpb.ReceivedMessage) bool {
	if f.DeadLetterTopic == "" {
		return false
	}
	if f.deliveries == nil {
		f.deliveries = map[string]int{}
	}
	id := m.GetMessage().GetMessageId()
	f.deliveries[id]++
	n := f.deliveries[id]
	if n < cmp.Or(f.MaxDeliveries, 5) {
		return false
	}
	_, err := f.Client.TopicAdminClient.Publish(ctx, &pubsubpb.PublishRequest{Topic: f.DeadLetterTopic, Messages: []*pubsubpb.PubsubMessage{{
		Data: m.GetMessage().GetData(), Attributes: map[string]string{"CloudPubSubDeadLetterSourceDeliveryCount": strconv.Itoa(n),
			"CloudPubSubDeadLetterSourceSubscription": f.Subscription}}}})
	if err != nil {
		f.Logger.Warn("local warehouse: dead-letter publish failed; the message will be redelivered", slog.Any("error", err))
		return false
	}
	delete(f.deliveries, id)
	f.deadLettered.Add(1)
	return true
}
