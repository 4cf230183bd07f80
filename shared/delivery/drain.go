package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/publish"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/store"
)

// Replication states a drain reports.
const (
	StateActive         = "active"
	StateDisabled       = "disabled"
	StateNoActiveTarget = "no_active_target"
)

// DrainResult is what one drain did.
type DrainResult struct {
	Workspace  string `json:"workspace"`
	Generation string `json:"generation,omitempty"`
	// State is active, disabled or no_active_target.
	State string `json:"state"`
	// Published is how many events Pub/Sub accepted and were acknowledged.
	Published int `json:"published"`
	// More reports that more pending events followed this batch.
	More bool `json:"more"`
	// Bytes is the published batch's size as the SDK counts it.
	Bytes int `json:"bytes"`
	// HeldBack is how many events of the batch could never be published and
	// were held back (they stay pending; the error log names them).
	HeldBack int `json:"held_back,omitempty"`
}

// Drain publishes at most one batch of a workspace's pending events: claim
// the oldest pending events (disjoint from concurrent drains), publish them
// as one Pub/Sub request, acknowledge them only after Pub/Sub accepted the
// whole batch. When replication is disabled or has no active target it
// publishes nothing and reports the state.
func (s *Service) Drain(ctx context.Context, workspaceID string) (DrainResult, error) {
	ws, err := s.Workspace(workspaceID)
	if err != nil {
		return DrainResult{Workspace: workspaceID}, err
	}
	st, err := s.Store(ctx, ws)
	if err != nil {
		return DrainResult{Workspace: ws.ID}, err
	}
	state, target, claim, err := st.ClaimActive(ctx, s.heldBack(ws.ID))
	res := DrainResult{Workspace: ws.ID, Generation: target.Generation, State: StateActive}
	switch {
	case errors.Is(err, store.ErrNoActiveTarget):
		res.State = StateNoActiveTarget
		return res, nil
	case err != nil:
		return res, err
	case !state.Enabled:
		res.State = StateDisabled
		return res, nil
	}
	return s.publishClaim(ctx, ws, target, claim)
}

// publishClaim publishes a claimed batch and acknowledges what Pub/Sub
// accepted.
func (s *Service) publishClaim(ctx context.Context, ws registry.Workspace, target store.Target, claim *store.Claim) (DrainResult, error) {
	res := DrainResult{Workspace: ws.ID, Generation: target.Generation, State: StateActive}
	defer claim.Release(ctx)
	if len(claim.Events) == 0 {
		return res, nil
	}
	res.More = claim.More

	// An event larger than Pub/Sub takes in a request can never be published.
	var batch []store.Pending
	for _, p := range claim.Events {
		if len(p.JSON) > publish.MaxMessageBytes {
			s.holdBack(ws, target, p, fmt.Errorf("its %d-byte message is larger than a Pub/Sub request may be", len(p.JSON)))
			res.HeldBack++
			continue
		}
		batch = append(batch, p)
	}
	published, err := s.publish(ctx, ws, target, batch, &res)
	var ackErr error
	if len(published) > 0 {
		ids := make([]string, len(published))
		bytes := event.BatchOverhead
		for i, p := range published {
			ids[i] = p.HistoryID
			bytes += event.MessageBytes(len(p.JSON))
		}
		if _, ackErr = claim.AcknowledgeIDs(ctx, ids); ackErr == nil {
			res.Published, res.Bytes = len(published), bytes
		}
	}
	if err != nil {
		return res, err
	}
	if ackErr != nil {
		// Published but not acknowledged: the events stay pending and are
		// published again later. Duplicates, never a loss.
		return res, fmt.Errorf("acknowledge after publish (the events will be published again): %w", ackErr)
	}
	return res, nil
}

// publish sends the batch as one request. If Pub/Sub rejects the request's
// content, each event is published alone to find the ones it can never take;
// those are held back and the others go on. It returns the events Pub/Sub
// accepted.
func (s *Service) publish(ctx context.Context, ws registry.Workspace, target store.Target, batch []store.Pending, res *DrainResult) ([]store.Pending, error) {
	if len(batch) == 0 {
		return nil, nil
	}
	topic := ws.PubSub.TopicName()
	_, err := s.cfg.Publisher.Publish(ctx, topic, payloads(batch))
	if err == nil {
		return batch, nil
	}
	if !publish.Rejected(err) {
		return nil, fmt.Errorf("%w: %w", errPublish, err)
	}
	if len(batch) == 1 {
		s.holdBack(ws, target, batch[0], err)
		res.HeldBack++
		return nil, nil
	}
	s.log.WarnContext(ctx, "Pub/Sub rejected a batch; publishing its events one by one to find the unpublishable ones",
		slog.String("workspace", ws.ID), slog.Int("events", len(batch)), slog.Any("error", err))
	var ok []store.Pending
	for _, p := range batch {
		_, err := s.cfg.Publisher.Publish(ctx, topic, [][]byte{p.JSON})
		switch {
		case err == nil:
			ok = append(ok, p)
		case publish.Rejected(err):
			s.holdBack(ws, target, p, err)
			res.HeldBack++
		default:
			return ok, fmt.Errorf("%w: %w", errPublish, err)
		}
	}
	return ok, nil
}

func payloads(batch []store.Pending) [][]byte {
	data := make([][]byte, len(batch))
	for i, p := range batch {
		data[i] = p.JSON
	}
	return data
}

// maxHeldBack bounds the held-back ids kept per workspace.
const maxHeldBack = 1000

// holdBack remembers an event that can never be published, so that this
// instance's later drains skip it instead of failing on it again, and logs
// it as an error naming it. It stays pending in the database.
func (s *Service) holdBack(ws registry.Workspace, target store.Target, p store.Pending, cause error) {
	s.log.Error("replication event can never be published; holding it back (it stays pending)",
		slog.String("workspace", ws.ID), slog.String("generation", target.Generation),
		slog.String("history_id", p.HistoryID), slog.String("history_table", p.HistoryTable),
		slog.String("event_id", p.Event.EventID), slog.Int("bytes", len(p.JSON)), slog.Any("error", cause))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[ws.ID] == nil {
		s.held[ws.ID] = map[string]bool{}
	}
	if len(s.held[ws.ID]) < maxHeldBack {
		s.held[ws.ID][p.HistoryID] = true
	}
}

// heldBack returns the workspace's held-back history ids (uuids, unique
// across generations).
func (s *Service) heldBack(workspace string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id := range s.held[workspace] {
		ids = append(ids, id)
	}
	return ids
}
