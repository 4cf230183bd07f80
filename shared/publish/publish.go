package publish

import (
	"cmp"
	"context"
	"errors"
	"fmt"
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

// Pub/Sub's limits on one Publish request.
const (
	// MaxRequestMessages is the most messages one Publish request carries.
	MaxRequestMessages = 1000
	// MaxRequestBytes is the largest Publish request Pub/Sub accepts.
	MaxRequestBytes = 10_000_000
	// MaxMessageBytes is the largest message data this publisher sends:
	// Pub/Sub's request limit less room for the request's own framing.
	MaxMessageBytes = MaxRequestBytes - 64*1024
)

// Config configures a Publisher.
type Config struct {
	// Project is the client's project. Publish names topics in full, so any
	// project works; it must not be empty. Default: "replication".
	Project string
	// Timeout bounds one Publish RPC; there is no retry inside it, so a
	// failure reaches the caller within this time. Default: 10s.
	Timeout time.Duration
	// EmulatorHost is the address of a Pub/Sub emulator (the value of
	// PUBSUB_EMULATOR_HOST): plain gRPC, no credentials. The client also
	// honours the environment variable itself.
	EmulatorHost string
	// Options are extra client options (an endpoint and credentials for
	// tests).
	Options []option.ClientOption
}

// Validate reports the first invalid field (a zero field takes its
// default).
func (c Config) Validate() error {
	if c.Timeout != 0 && (c.Timeout < 100*time.Millisecond || c.Timeout > time.Minute) {
		return fmt.Errorf("Timeout %v: must be between 100ms and 1m", c.Timeout)
	}
	return nil
}

// Publisher publishes one batch as one Publish RPC: every message is stored
// or none is reported stored.
type Publisher struct {
	client  *pubsub.Client
	timeout time.Duration
}

// New returns a Publisher. Creating it does not contact Pub/Sub.
func New(ctx context.Context, cfg Config) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("publish: invalid config: %w", err)
	}
	cfg.Project = cmp.Or(cfg.Project, "replication")
	cfg.Timeout = cmp.Or(cfg.Timeout, 10*time.Second)
	opts := cfg.Options
	if cfg.EmulatorHost != "" {
		opts = append([]option.ClientOption{option.WithEndpoint(cfg.EmulatorHost), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials()))}, opts...)
	}
	client, err := pubsub.NewClient(ctx, cfg.Project, opts...)
	if err != nil {
		return nil, fmt.Errorf("publish: create Pub/Sub client: %w", err)
	}
	return &Publisher{client: client, timeout: cfg.Timeout}, nil
}

// Close closes the client.
func (p *Publisher) Close() error { return p.client.Close() }

// Publish sends data as the messages of one Publish RPC to topic (its full
// name, projects/<p>/topics/<t>) and returns their message ids, one per
// message, or one error. The RPC is not retried: the client library's
// default of retrying for up to a minute is replaced by one attempt bounded
// by the configured timeout. An error does not prove that nothing was
// stored (a response can be lost), so a caller that publishes again may
// duplicate; it never proves that anything was.
func (p *Publisher) Publish(ctx context.Context, topic string, data [][]byte) ([]string, error) {
	if len(data) == 0 {
		return nil, nil
	}
	if len(data) > MaxRequestMessages {
		return nil, fmt.Errorf("publish: %d messages: %w", len(data), ErrTooManyMessages)
	}
	msgs := make([]*pubsubpb.PubsubMessage, len(data))
	for i, d := range data {
		msgs[i] = &pubsubpb.PubsubMessage{Data: d}
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	resp, err := p.client.TopicAdminClient.Publish(ctx, &pubsubpb.PublishRequest{Topic: topic, Messages: msgs},
		gax.WithTimeout(p.timeout), gax.WithRetry(func() gax.Retryer { return nil }))
	if err != nil {
		// The client's own deadline (gax's, the same timeout) may end the
		// call a moment before ctx's: say which either way.
		if ctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded {
			return nil, fmt.Errorf("publish: %d messages to %s: no answer within %v: %w", len(data), topic, p.timeout, err)
		}
		return nil, fmt.Errorf("publish: %d messages to %s: %w", len(data), topic, err)
	}
	if len(resp.MessageIds) != len(data) {
		return nil, fmt.Errorf("publish: %d messages to %s: Pub/Sub returned %d ids", len(data), topic, len(resp.MessageIds))
	}
	return resp.MessageIds, nil
}

// ErrTooManyMessages: more messages than one Publish request carries.
var ErrTooManyMessages = errors.New("more messages than one Publish request carries")

// Rejected reports whether Pub/Sub refused the request's content
// (InvalidArgument): retrying the same messages cannot succeed, and one of
// them may be unpublishable.
func Rejected(err error) bool {
	return status.Code(unwrapStatus(err)) == codes.InvalidArgument
}

// Misconfigured reports an error that retrying cannot fix and that is not
// about the messages: a missing topic or missing permission.
func Misconfigured(err error) bool {
	switch status.Code(unwrapStatus(err)) {
	case codes.NotFound, codes.PermissionDenied, codes.Unauthenticated:
		return true
	}
	return false
}

// unwrapStatus finds a gRPC status in an error chain.
func unwrapStatus(err error) error {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if _, ok := status.FromError(e); ok {
			return e
		}
	}
	return err
}

// Code is the gRPC status code of a publish error: DeadlineExceeded for a
// time-out, Unknown for an error that carries no status.
func Code(err error) codes.Code {
	if errors.Is(err, context.DeadlineExceeded) {
		return codes.DeadlineExceeded
	}
	return status.Code(unwrapStatus(err))
}
