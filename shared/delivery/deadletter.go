package delivery

import (
	"cmp"
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
	Pull(ctx context.Context, subscription string, max int) (msgs []deadletter.Message, exhausted bool, err error)
	Ack(ctx context.Context, subscription string, ackIDs []string) error
	Nack(ctx context.Context, subscription string, ackIDs []string) error
}

// DefaultDeadLetterBudget bounds how long DeadLetters reads, and
// DefaultDeadLetterMax how many messages.
const (
	DefaultDeadLetterBudget = 30 * time.Second
	DefaultDeadLetterMax    = 1000
)

// DeadLetterOptions configures DeadLetters.
type DeadLetterOptions struct {
	// Max is the most messages read. Default: DefaultDeadLetterMax.
	Max int
	// Budget bounds the reading. Default: DefaultDeadLetterBudget.
	Budget time.Duration
	// Events, when not empty, are the event ids Republish or Discard act
	// on; the other messages read are handed back.
	Events []string
	// Republish publishes the messages read to the events topic again and
	// then acknowledges them; Discard acknowledges them (they are gone),
	// logging each event discarded. Otherwise they are handed back.
	Republish bool
	Discard   bool
}

// DeadLetterReport is what DeadLetters found (and did).
type DeadLetterReport struct {
	Subscription string `json:"subscription"`
	// Messages is how many distinct messages were read (at most Max).
	Messages int `json:"messages"`
	// Complete reports that the subscription was read through; otherwise
	// Max or the time budget stopped the reading and more may remain.
	Complete bool `json:"complete"`
	// Oldest is when the oldest message read was dead-lettered, and
	// OldestAgeSeconds its age.
	Oldest           *time.Time `json:"oldest_dead_lettered,omitempty"`
	OldestAgeSeconds float64    `json:"oldest_age_seconds,omitempty"`
	// Events are the dead-lettered events, by event id.
	Events []DeadLetteredEvent `json:"events,omitempty"`
	// Republished and Discarded count the messages published again and
	// removed, or removed.
	Republished int `json:"republished,omitempty"`
	Discarded   int `json:"discarded,omitempty"`
	// NotFound are the event ids of DeadLetterOptions.Events that the
	// messages read did not hold.
	NotFound []string `json:"not_found,omitempty"`
}

// DeadLetteredEvent is one event found in the dead-letter subscription.
type DeadLetteredEvent struct {
	EventID string `json:"event_id"`
	// Generation, EntityID, RecordKey and Revision are read from the
	// message (empty when it is not an event).
	Generation string `json:"generation,omitempty"`
	EntityID   string `json:"entity_id,omitempty"`
	// Entity is the entity's name, as --entity takes it (the active
	// generation's; empty when it names no such entity or could not be
	// read).
	Entity    string `json:"entity,omitempty"`
	RecordKey string `json:"record_key,omitempty"`
	Revision  string `json:"revision,omitempty"`
	// Copies is how many of its messages the subscription holds: one per
	// time it was published and could not be written.
	Copies int `json:"copies"`
	// Bytes is the size of one copy.
	Bytes int `json:"bytes"`
	// DeliveryAttempts is the most attempts Pub/Sub made on one copy.
	DeliveryAttempts int `json:"delivery_attempts"`
	// FirstDeadLettered and LastDeadLettered are its copies' publish times
	// on the dead-letter topic.
	FirstDeadLettered time.Time `json:"first_dead_lettered"`
	LastDeadLettered  time.Time `json:"last_dead_lettered"`
	messages          []deadletter.Message
}

// LogDeadLetterDiscarded is the log line of each event `job dead-letter
// --discard` removed.
const LogDeadLetterDiscarded = "replication: dead letter discarded"

// DeadLetters reads a workspace's dead-letter subscription (each message
// once, at most opts.Max of them, within opts.Budget) and reports the
// events it holds. With Republish it publishes them to the events topic
// again (after their cause was fixed) and acknowledges them; with Discard
// it acknowledges them and logs each; otherwise, and for the messages of
// events not in opts.Events, it hands them back unchanged.
func (s *Service) DeadLetters(ctx context.Context, workspaceID string, opts DeadLetterOptions) (DeadLetterReport, error) {
	ws, err := s.Workspace(workspaceID)
	if err != nil {
		return DeadLetterReport{}, err
	}
	if s.cfg.DeadLetters == nil {
		return DeadLetterReport{}, errors.New("delivery: no dead-letter reader configured")
	}
	if opts.Republish && opts.Discard {
		return DeadLetterReport{}, errors.New("delivery: republish or discard, not both")
	}
	sub := ws.PubSub.DeadLetterSubscriptionName()
	rep := DeadLetterReport{Subscription: sub}
	rctx, cancel := context.WithTimeout(ctx, cmpDuration(opts.Budget, DefaultDeadLetterBudget))
	msgs, exhausted, err := s.cfg.DeadLetters.Pull(rctx, sub, cmp.Or(max(opts.Max, 0), DefaultDeadLetterMax))
	cancel()
	if err != nil {
		return rep, err
	}
	// Whatever happens next, the messages read are acknowledged or handed
	// back, even when ctx ends: a detached context for the answers.
	ctx = context.WithoutCancel(ctx)
	rep.Messages, rep.Complete = len(msgs), exhausted
	byEvent, order := groupDeadLetters(msgs, &rep)
	if rep.Oldest != nil {
		rep.OldestAgeSeconds = max(time.Since(*rep.Oldest), 0).Seconds()
	}
	var chosen, rest []deadletter.Message
	var chosenEvents []DeadLetteredEvent
	for _, id := range order {
		e := byEvent[id]
		rep.Events = append(rep.Events, *e)
		if (opts.Republish || opts.Discard) && (len(opts.Events) == 0 || slices.Contains(opts.Events, id)) {
			chosen = append(chosen, e.messages...)
			chosenEvents = append(chosenEvents, *e)
		} else {
			rest = append(rest, e.messages...)
		}
	}
	names := s.entityNames(ctx, workspaceID)
	for i := range rep.Events {
		rep.Events[i].messages = nil
		rep.Events[i].Entity = names[rep.Events[i].EntityID]
	}
	for _, id := range opts.Events {
		if byEvent[id] == nil {
			rep.NotFound = append(rep.NotFound, id)
		}
	}
	if len(rest) > 0 {
		if err := s.cfg.DeadLetters.Nack(ctx, sub, ackIDs(rest)); err != nil {
			return rep, err
		}
	}
	switch {
	case opts.Discard:
		return rep, s.discard(ctx, workspaceID, sub, chosenEvents, chosen, &rep)
	case opts.Republish:
		return rep, s.republish(ctx, ws.PubSub.TopicName(), sub, chosen, &rep)
	}
	return rep, nil
}

// groupDeadLetters groups dead-lettered messages by event, in the order
// first seen, with their copies, attempts and times, and notes the oldest
// in rep.
func groupDeadLetters(msgs []deadletter.Message, rep *DeadLetterReport) (byEvent map[string]*DeadLetteredEvent, order []string) {
	byEvent = map[string]*DeadLetteredEvent{}
	for _, m := range msgs {
		var ev struct {
			EventID    string `json:"event_id"`
			Generation string `json:"generation"`
			EntityID   string `json:"entity_id"`
			RecordKey  any    `json:"record_key"`
			Revision   any    `json:"revision"`
		}
		id := "(not an event: message " + m.MessageID + ")"
		if json.Unmarshal(m.Data, &ev) == nil && ev.EventID != "" {
			id = ev.EventID
		}
		e, ok := byEvent[id]
		if !ok {
			e = &DeadLetteredEvent{EventID: id, Generation: ev.Generation, EntityID: ev.EntityID, RecordKey: scalar(ev.RecordKey),
				Revision: scalar(ev.Revision), Bytes: len(m.Data), FirstDeadLettered: m.Published, LastDeadLettered: m.Published}
			byEvent[id] = e
			order = append(order, id)
		}
		e.Copies++
		e.messages = append(e.messages, m)
		e.DeliveryAttempts = max(e.DeliveryAttempts, m.DeliveryAttempts)
		if m.Published.Before(e.FirstDeadLettered) {
			e.FirstDeadLettered = m.Published
		}
		if m.Published.After(e.LastDeadLettered) {
			e.LastDeadLettered = m.Published
		}
		if rep.Oldest == nil || m.Published.Before(*rep.Oldest) {
			oldest := m.Published.UTC()
			rep.Oldest = &oldest
		}
	}
	return byEvent, order
}

// discard acknowledges the chosen messages, logging each event removed.
func (s *Service) discard(ctx context.Context, workspaceID, sub string, events []DeadLetteredEvent, chosen []deadletter.Message, rep *DeadLetterReport) error {
	if len(chosen) == 0 {
		return nil
	}
	if err := s.cfg.DeadLetters.Ack(ctx, sub, ackIDs(chosen)); err != nil {
		return fmt.Errorf("discard %d dead-lettered messages: %w", len(chosen), err)
	}
	rep.Discarded = len(chosen)
	for _, e := range events {
		s.log.WarnContext(ctx, LogDeadLetterDiscarded, "workspace", workspaceID, "subscription", sub, "event_id", e.EventID,
			"generation", e.Generation, "entity_id", e.EntityID, "record_key", e.RecordKey, "revision", e.Revision, "copies", e.Copies,
			"bytes", e.Bytes, "delivery_attempts", e.DeliveryAttempts, "first_dead_lettered", e.FirstDeadLettered.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// republish publishes the chosen messages to the events topic in requests
// within Pub/Sub's limits; each request's messages are acknowledged once
// Pub/Sub has taken them.
func (s *Service) republish(ctx context.Context, topic, sub string, msgs []deadletter.Message, rep *DeadLetterReport) error {
	for len(msgs) > 0 {
		n, bytes := 0, 0
		for n < len(msgs) && n < publish.MaxRequestMessages && bytes+len(msgs[n].Data) <= publish.MaxMessageBytes {
			bytes += len(msgs[n].Data)
			n++
		}
		n = max(n, 1)
		batch := msgs[:n]
		data := make([][]byte, len(batch))
		for i, m := range batch {
			data[i] = m.Data
		}
		if _, err := s.cfg.Publisher.Publish(ctx, topic, data); err != nil {
			_ = s.cfg.DeadLetters.Nack(ctx, sub, ackIDs(msgs))
			return fmt.Errorf("republish %d dead-lettered messages: %w", len(batch), err)
		}
		if err := s.cfg.DeadLetters.Ack(ctx, sub, ackIDs(batch)); err != nil {
			return fmt.Errorf("republished %d messages but could not remove them from the dead letters (they will be republished again next time): %w", len(batch), err)
		}
		rep.Republished += len(batch)
		msgs = slices.Delete(msgs, 0, n)
	}
	return nil
}

func ackIDs(msgs []deadletter.Message) []string {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.AckID
	}
	return ids
}

// scalar writes a JSON scalar read from a message as text ("" when absent).
func scalar(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	}
	raw, _ := json.Marshal(v)
	return string(raw)
}

// DeadLetterBacklog is a dead-letter subscription's backlog as `job status`
// shows it.
type DeadLetterBacklog struct {
	// Messages counts the messages read, at most the bound; Capped that
	// the bound (or the time) stopped the count.
	Messages int  `json:"dead_letters"`
	Capped   bool `json:"dead_letters_capped,omitempty"`
	// OldestAgeSeconds is the oldest message's age.
	OldestAgeSeconds float64 `json:"oldest_dead_letter_age_seconds,omitempty"`
}

// DeadLetterBacklog counts up to max messages of the workspace's
// dead-letter subscription within budget, and the oldest one's age,
// handing them back at once.
func (s *Service) DeadLetterBacklog(ctx context.Context, workspaceID string, max int, budget time.Duration) (DeadLetterBacklog, error) {
	rep, err := s.DeadLetters(ctx, workspaceID, DeadLetterOptions{Max: max, Budget: budget})
	if err != nil {
		return DeadLetterBacklog{}, err
	}
	return DeadLetterBacklog{Messages: rep.Messages, Capped: !rep.Complete, OldestAgeSeconds: rep.OldestAgeSeconds}, nil
}
