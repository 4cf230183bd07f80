package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/publish"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/store"
)

// publishBatch publishes a claimed batch: what Pub/Sub accepted, what is
// to be set aside (the claim's unpublishable events, those too large for a
// request, those Pub/Sub refuses), and err when Pub/Sub was unavailable
// (what it accepted before is kept; the rest stays pending).
func (s *Service) publishBatch(ctx context.Context, ws registry.Workspace, claim *store.Claim) *publishing {
	out := &publishing{svc: s, topic: ws.PubSub.TopicName(), generation: claim.Target().Generation}
	out.aside = append(out.aside, claim.Unpublishable...)
	// Events set aside before go in a request of their own, so that one
	// still refused does not make the fresh events' request fail; a
	// suspected event (see suspects) goes alone, first.
	var fresh, retrying []store.Pending
	var alone *store.Pending
	for i, p := range claim.Events {
		decided, ok := s.suspects.decided(out.generation, p.HistoryID)
		switch {
		case ok: // set aside before, its finish lost (see suspect.aside)
			out.aside = append(out.aside, decided)
		case len(p.JSON) > publish.MaxMessageBytes:
			out.aside = append(out.aside, store.SetAside{HistoryID: p.HistoryID, HistoryTable: p.HistoryTable, EventID: p.EventID, Reason: store.ReasonTooLarge,
				Cause: fmt.Errorf("its %d-byte message is larger than a Pub/Sub request may be", len(p.JSON))})
		case alone == nil && (len(claim.Events) == 1 || s.suspects.isSuspect(out.generation, p.HistoryID)):
			alone = &claim.Events[i]
		case p.Backoff > 0:
			retrying = append(retrying, p)
		default:
			fresh = append(fresh, p)
		}
	}
	if alone != nil {
		out.err = out.publishAlone(ctx, *alone)
		if out.err != nil && !out.failedAlone {
			return out.end() // Pub/Sub is unavailable or misconfigured: the rest stays pending
		}
	}
	for _, group := range [][]store.Pending{fresh, retrying} {
		if err := out.publish(ctx, group); err != nil {
			out.err, out.othersFailed = err, true
			break // Pub/Sub is unavailable: what it accepted is acknowledged, the rest stays pending
		}
	}
	return out.end()
}

// end adds the refused events to those to set aside.
func (p *publishing) end() *publishing {
	p.aside = append(p.aside, p.rejected...)
	return p
}

// publishAlone publishes one event in a request of its own. A failure
// other than a refusal or a misconfiguration counts against the event
// (suspects.failedAlone) and, at the count, sets it aside; the publishing
// then goes on with the other events.
func (p *publishing) publishAlone(ctx context.Context, e store.Pending) error {
	err := p.send(ctx, []store.Pending{e})
	switch {
	case err == nil:
		p.svc.suspects.forget(p.generation, e.HistoryID)
		return nil
	case publish.Rejected(err):
		p.svc.suspects.forget(p.generation, e.HistoryID)
		p.reject(e, err)
		p.refusal = err
		return nil
	case publish.Misconfigured(err) || ctx.Err() != nil || neverTheEvents(publish.Code(err)):
		// Not the event's fault: Pub/Sub (or the way to it) is down, as
		// for any batch.
		return fmt.Errorf("%w: %w", errPublish, err)
	}
	p.failedAlone = true
	code := publish.Code(err)
	setAside, again := p.svc.suspects.failedAlone(p.topic, p.generation, e.HistoryID, code, p.failure)
	p.probe = p.svc.suspects.worthProbing(p.topic, p.failure, again)
	if setAside {
		aside := store.SetAside{HistoryID: e.HistoryID, HistoryTable: e.HistoryTable, EventID: e.EventID,
			Reason: store.ReasonPublishFailed, Code: int(code),
			Cause: fmt.Errorf("%d publishes of it alone in a row failed with %s while Pub/Sub took other events: %w", suspectFailures, code, err)}
		p.svc.suspects.decide(p.generation, aside)
		p.aside = append(p.aside, aside)
		return nil
	}
	return fmt.Errorf("%w: %w: %w", errPublish, errFailedAlone, err)
}

// errFailedAlone marks the failure of an event published alone (see
// suspects).
var errFailedAlone = errors.New("an event failed alone")

// acceptedIDs returns the history ids of the events Pub/Sub accepted.
func (p *publishing) acceptedIDs() []string {
	ids := make([]string, len(p.accepted))
	for i, e := range p.accepted {
		ids[i] = e.HistoryID
	}
	return ids
}

// bytes is the accepted events' size as the SDK counts a batch.
func (p *publishing) bytes() int {
	n := event.BatchOverhead
	for _, e := range p.accepted {
		n += event.MessageBytes(len(e.JSON))
	}
	return n
}

// publishing is one drain's publishing of its batch.
type publishing struct {
	svc        *Service
	topic      string
	generation string
	accepted   []store.Pending
	rejected   []store.SetAside
	// aside is everything to set aside once the publishing has ended.
	aside []store.SetAside
	// err is the failure that ended the publishing (Pub/Sub unavailable).
	err      error
	requests int
	elapsed  time.Duration
	refusal  error // Pub/Sub's last refusal
	// failedAlone: an event published alone failed (and stays pending, or
	// was set aside); othersFailed: a request of the others failed too.
	failedAlone, othersFailed bool
	failure                   failure // the last failed request's
	// probe: the event that failed alone is worth the claim beside it.
	probe bool
}

// send sends events as one Publish request.
func (p *publishing) send(ctx context.Context, events []store.Pending) error {
	data := make([][]byte, len(events))
	for i, e := range events {
		data[i] = e.JSON
	}
	started := time.Now()
	_, err := p.svc.cfg.Publisher.Publish(ctx, p.topic, data)
	p.requests++
	p.elapsed += time.Since(started)
	switch {
	case err == nil:
		p.accepted = append(p.accepted, events...)
		p.svc.suspects.published(p.topic)
	case !publish.Rejected(err) && !publish.Misconfigured(err):
		p.failure = p.svc.suspects.noteFailure(p.topic)
		if !neverTheEvents(publish.Code(err)) {
			p.svc.suspects.mark(p.generation, events)
		}
	}
	return err
}

// publish sends a group of events as one request. When Pub/Sub refuses the
// request's content (INVALID_ARGUMENT), it finds the events it refuses:
// first one of them, by sending the first half of the refused run (if
// Pub/Sub takes it, the refusal is in the second half, otherwise in the
// first), and then every run not yet tried, in one request. One refused
// event among n costs at most 2 + ⌈log₂ n⌉ requests. If that request is
// refused too, the rest is searched half by half (each half sent once, a
// half known to hold a refusal not sent again): n events, however many are
// refused, cost at most 2n + ⌈log₂ n⌉ + 2 requests. Any other failure ends
// the publishing.
func (p *publishing) publish(ctx context.Context, events []store.Pending) error {
	if len(events) == 0 {
		return nil
	}
	err := p.send(ctx, events)
	if err == nil {
		return nil
	}
	if !publish.Rejected(err) {
		return fmt.Errorf("%w: %w", errPublish, err)
	}
	// events is refused: find one event it refuses.
	var untried []store.Pending
	refused := events
	for len(refused) > 1 {
		half := refused[:len(refused)/2]
		switch herr := p.send(ctx, half); {
		case herr == nil:
			refused = refused[len(refused)/2:]
		case publish.Rejected(herr):
			untried = append(untried, refused[len(refused)/2:]...)
			refused, err = half, herr
		default:
			return fmt.Errorf("%w: %w", errPublish, herr)
		}
	}
	p.reject(refused[0], err)
	p.refusal = err
	if len(untried) == 0 {
		return nil
	}
	return p.bisect(ctx, untried, false)
}

// bisect publishes events, sending them as one request unless known to be
// refused, and searches a refused run half by half.
func (p *publishing) bisect(ctx context.Context, events []store.Pending, knownRefused bool) error {
	if !knownRefused {
		err := p.send(ctx, events)
		switch {
		case err == nil:
			return nil
		case !publish.Rejected(err):
			return fmt.Errorf("%w: %w", errPublish, err)
		}
		p.refusal = err
	}
	if len(events) == 1 {
		p.reject(events[0], p.refusal)
		return nil
	}
	before := len(p.rejected)
	if err := p.bisect(ctx, events[:len(events)/2], false); err != nil {
		return err
	}
	// A refused run whose first half Pub/Sub took entirely holds its
	// refusal in the second half: that half is not sent as a whole.
	return p.bisect(ctx, events[len(events)/2:], knownRefused && len(p.rejected) == before)
}

// reject records an event Pub/Sub refused.
func (p *publishing) reject(e store.Pending, cause error) {
	p.rejected = append(p.rejected, store.SetAside{HistoryID: e.HistoryID, HistoryTable: e.HistoryTable, EventID: e.EventID,
		Reason: store.ReasonRejected, Cause: cause})
}

// asideWritten takes the events a drain's finish set aside: it forgets
// their suspect records (see suspect.aside) and names them, one error line
// per drain (an event is set aside once per backoff period, whichever
// instance finds it).
func (s *Service) asideWritten(ctx context.Context, ws registry.Workspace, target store.Target, aside []store.SetAside) {
	if len(aside) == 0 {
		return
	}
	s.suspects.written(target.Generation, aside)
	events := make([]map[string]string, len(aside))
	for i, a := range aside {
		events[i] = map[string]string{"history_id": a.HistoryID, "event_id": a.EventID, "reason": string(a.Reason)}
		if a.HistoryTable != "" {
			events[i]["history_table"] = a.HistoryTable
		}
		if a.Cause != nil {
			events[i]["cause"] = a.Cause.Error()
		}
	}
	s.log.ErrorContext(ctx, LogEventsSetAside,
		slog.String("workspace", ws.ID), slog.String("generation", target.Generation), slog.Int("count", len(aside)),
		slog.Any("events", events))
}

// LogEventsSetAside is the error line of a drain that set events aside.
const LogEventsSetAside = "replication: events set aside: they cannot be published; the drain retries them after a backoff"
