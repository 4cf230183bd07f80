package localwarehouse

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// Feeder feeds the local warehouse from a Pub/Sub subscription the way a
// BigQuery subscription feeds BigQuery: pull, write what fits, acknowledge
// it; refuse (nack) what does not fit, so that Pub/Sub redelivers it and,
// after the subscription's maximum delivery attempts, moves it to its
// dead-letter topic.
type Feeder struct {
	Client       *pubsub.Client
	Subscription string // full name
	Warehouse    *Local
	Logger       *slog.Logger
	// Refuse, when set, makes the feeder refuse messages it returns true
	// for, as if they did not fit the table (the local mode uses it to send
	// one event to the dead letter).
	Refuse func(data []byte) bool

	written, refused atomic.Int64
}

// Written is how many messages were written to the table.
func (f *Feeder) Written() int64 { return f.written.Load() }

// Refused is how many deliveries were refused (nacked).
func (f *Feeder) Refused() int64 { return f.refused.Load() }

// Run feeds until ctx ends.
func (f *Feeder) Run(ctx context.Context) error {
	for ctx.Err() == nil {
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
		var ack, nack []string
		for _, m := range resp.ReceivedMessages {
			data := m.GetMessage().GetData()
			if _, err := decode(data); err != nil || (f.Refuse != nil && f.Refuse(data)) {
				nack = append(nack, m.AckId)
				continue
			}
			fit = append(fit, data)
			ack = append(ack, m.AckId)
		}
		if len(fit) > 0 {
			if err := f.Warehouse.Ingest(ctx, fit); err != nil {
				if errors.Is(err, context.Canceled) {
					return nil
				}
				f.Logger.Warn("local warehouse: write failed; the messages will be redelivered", slog.Any("error", err))
				nack = append(nack, ack...)
				ack = nil
			} else {
				f.written.Add(int64(len(fit)))
			}
		}
		if len(ack) > 0 {
			_ = f.Client.SubscriptionAdminClient.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: f.Subscription, AckIds: ack})
		}
		if len(nack) > 0 {
			f.refused.Add(int64(len(nack)))
			_ = f.Client.SubscriptionAdminClient.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{
				Subscription: f.Subscription, AckIds: nack, AckDeadlineSeconds: 0})
		}
	}
	return nil
}
