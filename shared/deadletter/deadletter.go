// Package deadletter reads a workspace's dead-letter subscription: the
// messages the BigQuery subscription could not write and moved to the
// dead-letter topic, so that an operator can see which events they hold
// and, once the cause is fixed, publish them again.
package deadletter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/googleapis/gax-go/v2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Config configures a Reader.
type Config struct {
	// Project is the client's project (subscriptions are named in full).
	// Default: "replication".
	Project string
	// EmulatorHost is a Pub/Sub emulator's address (PUBSUB_EMULATOR_HOST).
	EmulatorHost string
	// PullTimeout bounds one Pull request; an empty subscription answers
	// nothing until it ends. Default: 5s.
	PullTimeout time.Duration
	// Options are extra client options (tests).
	Options []option.ClientOption
}

// Reader pulls dead-lettered messages.
type Reader struct {
	client  *pubsub.Client
	timeout time.Duration
}

// Validate reports the first invalid field (a zero field takes its
// default).
func (c Config) Validate() error {
	if c.PullTimeout != 0 && (c.PullTimeout < 100*time.Millisecond || c.PullTimeout > time.Minute) {
		return fmt.Errorf("PullTimeout %v: must be between 100ms and 1m", c.PullTimeout)
	}
	return nil
}

// New returns a Reader. It does not contact Pub/Sub.
func New(ctx context.Context, cfg Config) (*Reader, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("deadletter: invalid config: %w", err)
	}
	opts := cfg.Options
	if cfg.EmulatorHost != "" {
		opts = append([]option.ClientOption{option.WithEndpoint(cfg.EmulatorHost), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials()))}, opts...)
	}
	client, err := pubsub.NewClient(ctx, cmp.Or(cfg.Project, "replication"), opts...)
	if err != nil {
		return nil, fmt.Errorf("deadletter: create Pub/Sub client: %w", err)
	}
	return &Reader{client: client, timeout: cmp.Or(cfg.PullTimeout, 5*time.Second)}, nil
}

// Close closes the client.
func (r *Reader) Close() error { return r.client.Close() }

// Message is one dead-lettered message, held (leased) until Ack or Nack.
type Message struct {
	AckID     string
	MessageID string
	Data      []byte
	// Published is when the message was dead-lettered (its publish time on
	// the dead-letter topic).
	Published time.Time
	// DeliveryAttempts is how many times the BigQuery subscription tried to
	// write it before giving up (Pub/Sub's
	// CloudPubSubDeadLetterSourceDeliveryCount attribute; 0 if absent).
	DeliveryAttempts int
}

// Pull returns up to max messages of subscription (its full name,
// projects/<p>/subscriptions/<s>), holding them until Ack or Nack, each
// message once: a message Pub/Sub hands out again while the listing runs
// (its lease ran out) is not counted twice, and its newest ack id is kept.
// It stops when a Pull returns nothing, or only messages already read (the
// subscription has been read through), or when ctx's deadline passes;
// exhausted reports that it stopped for one of the first two reasons, so
// that the messages returned are all the subscription held.
func (r *Reader) Pull(ctx context.Context, subscription string, max int) (msgs []Message, exhausted bool, err error) {
	seen := map[string]int{} // message id → index in msgs
	for len(msgs) < max {
		// Which deadline comes first, the pull's own or the caller's,
		// decides what a DeadlineExceeded means (the server may answer it a
		// moment before the client's context says so).
		callerFirst := false
		if dl, ok := ctx.Deadline(); ok && dl.Before(time.Now().Add(r.timeout)) {
			callerFirst = true
		}
		pctx, cancel := context.WithTimeout(ctx, r.timeout)
		resp, err := r.client.SubscriptionAdminClient.Pull(pctx, &pubsubpb.PullRequest{
			Subscription: subscription, MaxMessages: int32(min(max-len(msgs), 1000)),
		}, gax.WithRetry(func() gax.Retryer { return nil }))
		cancel()
		timedOut := errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded
		switch {
		case timedOut && callerFirst, errors.Is(ctx.Err(), context.DeadlineExceeded):
			return msgs, false, nil // the caller's time is up: what was read so far
		case timedOut:
			return msgs, true, nil // nothing more within the pull's timeout
		}
		if err != nil {
			if len(msgs) > 0 {
				_ = r.Nack(context.WithoutCancel(ctx), subscription, ackIDs(msgs))
			}
			return nil, false, fmt.Errorf("deadletter: pull %s: %w", subscription, err)
		}
		fresh := 0
		for _, m := range resp.ReceivedMessages {
			msg := Message{AckID: m.AckId, MessageID: m.GetMessage().GetMessageId(), Data: m.GetMessage().GetData()}
			if ts := m.GetMessage().GetPublishTime(); ts != nil {
				msg.Published = ts.AsTime()
			}
			msg.DeliveryAttempts, _ = strconv.Atoi(m.GetMessage().GetAttributes()["CloudPubSubDeadLetterSourceDeliveryCount"])
			if i, ok := seen[msg.MessageID]; ok {
				msgs[i].AckID = msg.AckID // the newest lease
				continue
			}
			seen[msg.MessageID] = len(msgs)
			msgs = append(msgs, msg)
			fresh++
		}
		if fresh == 0 {
			return msgs, true, nil
		}
	}
	return msgs, false, nil
}

func ackIDs(msgs []Message) []string {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.AckID
	}
	return ids
}

// Ack removes messages from the subscription.
func (r *Reader) Ack(ctx context.Context, subscription string, ackIDs []string) error {
	for start := 0; start < len(ackIDs); start += 1000 {
		end := min(start+1000, len(ackIDs))
		if err := r.client.SubscriptionAdminClient.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: subscription, AckIds: ackIDs[start:end]}); err != nil {
			return fmt.Errorf("deadletter: acknowledge %d messages of %s: %w", end-start, subscription, err)
		}
	}
	return nil
}

// Nack hands messages back to the subscription at once, unchanged.
func (r *Reader) Nack(ctx context.Context, subscription string, ackIDs []string) error {
	for start := 0; start < len(ackIDs); start += 1000 {
		end := min(start+1000, len(ackIDs))
		if err := r.client.SubscriptionAdminClient.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{
			Subscription: subscription, AckIds: ackIDs[start:end], AckDeadlineSeconds: 0}); err != nil {
			return fmt.Errorf("deadletter: release %d messages of %s: %w", end-start, subscription, err)
		}
	}
	return nil
}
