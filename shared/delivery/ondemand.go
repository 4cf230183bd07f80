package delivery

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/segmentstream/ontology-replication/shared/deadletter"
	"github.com/segmentstream/ontology-replication/shared/publish"
)

// onDemand opens a client on its first use, and again after a failed
// open: a command that never publishes (job status, audit, set-aside)
// needs no Pub/Sub credentials and no publish right, and one that does
// fails at its first publish with the client's error. Open opens the
// services' clients through it too, at once (openNow).
type onDemand[T any] struct {
	mu     sync.Mutex
	open   func() (T, error)
	close  func(T)
	client T
	opened bool
}

func (o *onDemand[T]) get() (T, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.opened {
		c, err := o.open()
		if err != nil {
			var zero T
			return zero, err
		}
		o.client, o.opened = c, true
	}
	return o.client, nil
}

// Close closes the client if it was opened.
func (o *onDemand[T]) Close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.opened {
		o.close(o.client)
		o.opened = false
	}
}

// onDemandPublisher is a Publisher whose client opens on the first
// Publish.
type onDemandPublisher struct{ onDemand[*publish.Publisher] }

func newOnDemandPublisher(ctx context.Context, cfg publish.Config) *onDemandPublisher {
	p := &onDemandPublisher{}
	p.open = func() (*publish.Publisher, error) { return publish.New(context.WithoutCancel(ctx), cfg) }
	p.close = func(c *publish.Publisher) { _ = c.Close() }
	return p
}

// Publish implements Publisher.
func (p *onDemandPublisher) Publish(ctx context.Context, topic string, data [][]byte) ([]string, error) {
	c, err := p.get()
	if err != nil {
		// Credentials or configuration, which no retry mends: said as
		// Pub/Sub says a refused login (publish.Misconfigured).
		return nil, fmt.Errorf("open the Pub/Sub publisher: %w", status.Error(codes.Unauthenticated, err.Error()))
	}
	return c.Publish(ctx, topic, data)
}

// onDemandDeadLetters is a DeadLetterReader whose client opens on first
// use.
type onDemandDeadLetters struct{ onDemand[*deadletter.Reader] }

func newOnDemandDeadLetters(ctx context.Context, cfg deadletter.Config) *onDemandDeadLetters {
	r := &onDemandDeadLetters{}
	r.open = func() (*deadletter.Reader, error) { return deadletter.New(context.WithoutCancel(ctx), cfg) }
	r.close = func(c *deadletter.Reader) { _ = c.Close() }
	return r
}

// Pull implements DeadLetterReader.
func (r *onDemandDeadLetters) Pull(ctx context.Context, subscription string, max int) ([]deadletter.Message, bool, error) {
	c, err := r.get()
	if err != nil {
		return nil, false, fmt.Errorf("open the dead-letter reader: %w", err)
	}
	return c.Pull(ctx, subscription, max)
}

// Ack implements DeadLetterReader.
func (r *onDemandDeadLetters) Ack(ctx context.Context, subscription string, ackIDs []string) error {
	c, err := r.get()
	if err != nil {
		return fmt.Errorf("open the dead-letter reader: %w", err)
	}
	return c.Ack(ctx, subscription, ackIDs)
}

// Nack implements DeadLetterReader.
func (r *onDemandDeadLetters) Nack(ctx context.Context, subscription string, ackIDs []string) error {
	c, err := r.get()
	if err != nil {
		return fmt.Errorf("open the dead-letter reader: %w", err)
	}
	return c.Nack(ctx, subscription, ackIDs)
}
