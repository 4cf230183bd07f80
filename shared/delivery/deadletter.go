package delivery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/segmentstream/ontology-replication/shared/deadletter"
	"github.com/segmentstream/ontology-replication/shared/publish"
)

// DeadLetterReader reads a dead-letter subscription; *deadletter.Reader is
// the implementation.
type DeadLetterReader interface {
	Pull(ctx context.Context, subscription string, max int) ([]deadletter.Message, error)
	Ack(ctx context.Context, subscription string, ackIDs []string) error
	Nack(ctx context.Context, subscription string, ackIDs []string) error
}

// DeadLetterOptions configures DeadLetters.
type DeadLetterOptions struct {
	// Max is the most messages read. Default: 1000.
	Max int
	// Republish publishes the messages read to the events topic again and
	// then acknowledges them; otherwise they are left in the subscription.
	Republish bool
}

// DeadLetterReport is what DeadLetters found (and did).
type DeadLetterReport struct {
	Subscription string `json:"subscription"`
	// Messages is how many messages were read (at most Max).
	Messages int `json:"messages"`
	// Events are the dead-lettered events, by event id.
	Events []DeadLetteredEvent `json:"events,omitempty"`
	// Republished is how many messages were published again and removed.
	Republished int `json:"republished,omitempty"`
}

// DeadLetteredEvent is one event found in the dead-letter subscription.
type DeadLetteredEvent struct {
	EventID string `json:"event_id"`
	// Copies is how many of its messages the subscription holds: one per
	// time it was published and could not be written.
	Copies int `json:"copies"`
	// DeliveryAttempts is the most attempts Pub/Sub made on one copy.
	DeliveryAttempts int `json:"delivery_attempts"`
	// FirstDeadLettered and LastDeadLettered are its copies' publish times
	// on the dead-letter topic.
	FirstDeadLettered time.Time `json:"first_dead_lettered"`
	LastDeadLettered  time.Time `json:"last_dead_lettered"`
}

// DeadLetters reads a workspace's dead-letter subscription and reports the
// events it holds; with Republish it publishes them to the events topic
// again (after their cause was fixed) and acknowledges them. Messages read
// are otherwise handed back unchanged.
func (s *Service) DeadLetters(ctx context.Context, workspaceID string, opts DeadLetterOptions) (DeadLetterReport, error) {
	ws, err := s.Workspace(workspaceID)
	if err != nil {
		return DeadLetterReport{}, err
	}
	if s.cfg.DeadLetters == nil {
		return DeadLetterReport{}, errors.New("delivery: no dead-letter reader configured")
	}
	sub := ws.PubSub.DeadLetterSubscriptionName()
	rep := DeadLetterReport{Subscription: sub}
	msgs, err := s.cfg.DeadLetters.Pull(ctx, sub, max(opts.Max, 1))
	if err != nil {
		return rep, err
	}
	rep.Messages = len(msgs)
	byEvent := map[string]*DeadLetteredEvent{}
	var order []string
	for _, m := range msgs {
		var ev struct {
			EventID string `json:"event_id"`
		}
		id := "(not an event: message " + m.MessageID + ")"
		if json.Unmarshal(m.Data, &ev) == nil && ev.EventID != "" {
			id = ev.EventID
		}
		e, ok := byEvent[id]
		if !ok {
			e = &DeadLetteredEvent{EventID: id, FirstDeadLettered: m.Published, LastDeadLettered: m.Published}
			byEvent[id] = e
			order = append(order, id)
		}
		e.Copies++
		e.DeliveryAttempts = max(e.DeliveryAttempts, m.DeliveryAttempts)
		if m.Published.Before(e.FirstDeadLettered) {
			e.FirstDeadLettered = m.Published
		}
		if m.Published.After(e.LastDeadLettered) {
			e.LastDeadLettered = m.Published
		}
	}
	for _, id := range order {
		rep.Events = append(rep.Events, *byEvent[id])
	}
	if !opts.Republish {
		if len(msgs) > 0 {
			ids := make([]string, len(msgs))
			for i, m := range msgs {
				ids[i] = m.AckID
			}
			return rep, s.cfg.DeadLetters.Nack(ctx, sub, ids)
		}
		return rep, nil
	}
	// Republish in requests within Pub/Sub's limits; each request's
	// messages are acknowledged once Pub/Sub has taken them.
	for len(msgs) > 0 {
		n, bytes := 0, 0
		for n < len(msgs) && n < publish.MaxRequestMessages && bytes+len(msgs[n].Data) <= publish.MaxMessageBytes {
			bytes += len(msgs[n].Data)
			n++
		}
		n = max(n, 1)
		batch := msgs[:n]
		data := make([][]byte, len(batch))
		ids := make([]string, len(batch))
		for i, m := range batch {
			data[i], ids[i] = m.Data, m.AckID
		}
		if _, err := s.cfg.Publisher.Publish(ctx, ws.PubSub.TopicName(), data); err != nil {
			rest := make([]string, 0, len(msgs))
			for _, m := range msgs {
				rest = append(rest, m.AckID)
			}
			_ = s.cfg.DeadLetters.Nack(ctx, sub, rest)
			return rep, fmt.Errorf("republish %d dead-lettered messages: %w", len(batch), err)
		}
		if err := s.cfg.DeadLetters.Ack(ctx, sub, ids); err != nil {
			return rep, fmt.Errorf("republished %d messages but could not remove them from the dead letters (they will be republished again next time): %w", len(batch), err)
		}
		rep.Republished += len(batch)
		msgs = slices.Delete(msgs, 0, n)
	}
	return rep, nil
}
