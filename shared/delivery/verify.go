package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/store"
)

// VerifyResult is what one verifier run did for one workspace.
type VerifyResult struct {
	Workspace  string `json:"workspace"`
	Generation string `json:"generation,omitempty"`
	State      string `json:"state,omitempty"`
	// Rounds is how many lookups were made (one per up to 1,000 due events).
	Rounds int `json:"rounds"`
	// Checked is how many accepted events were looked up.
	Checked int `json:"checked"`
	// Verified is how many were found and marked verified.
	Verified int `json:"verified"`
	// Retried is how many were absent (looked for again later).
	Retried int `json:"retried"`
	// Requeued is how many of those went back to pending, accepted more than
	// 15 minutes ago.
	Requeued int `json:"requeued"`
	// Swept is how many pending events the sweep published.
	Swept int `json:"swept"`
	// RequeuedRepeatedly lists the events this pass sent back to pending
	// that this verifier has sent back more than Config.RequeueReportAfter
	// times: events that keep not landing (a message the BigQuery
	// subscription dead-letters, for example; `job dead-letter` shows it).
	RequeuedRepeatedly []RequeuedEvent `json:"requeued_repeatedly,omitempty"`
	// Error is the failure that ended this workspace's run, if any.
	Error string `json:"error,omitempty"`
}

// Verify runs verification rounds for a workspace until nothing is due or
// ctx ends: take up to 1,000 due accepted events, look them up in one
// warehouse query, mark the present verified and retry the absent (checked
// ones only). A failed lookup changes nothing for its round. Ids the lookup
// returns that were not asked for are ignored.
func (s *Service) Verify(ctx context.Context, workspaceID string) (VerifyResult, error) {
	res, err := s.verify(ctx, workspaceID)
	if err != nil && ctx.Err() != nil {
		// The budget ran out mid-round: whatever committed stays, the rest
		// is due again next run. That is not a failure.
		return res, nil
	}
	return res, err
}

func (s *Service) verify(ctx context.Context, workspaceID string) (VerifyResult, error) {
	res := VerifyResult{Workspace: workspaceID}
	if s.cfg.Warehouse == nil {
		return res, errors.New("delivery: no warehouse configured for verification")
	}
	ws, err := s.Workspace(workspaceID)
	if err != nil {
		return res, err
	}
	st, err := s.Lease(ctx, ws)
	if err != nil {
		return res, err
	}
	defer st.Release()
	_, target, err := st.ActiveTarget(ctx)
	if errors.Is(err, store.ErrNoActiveTarget) {
		res.State = StateNoActiveTarget
		return res, nil
	}
	if err != nil {
		return res, err
	}
	res.Generation, res.State = target.Generation, StateActive
	for ctx.Err() == nil {
		due, err := st.DueUnverified(ctx, target)
		if err != nil {
			return res, err
		}
		if len(due) == 0 {
			return res, nil
		}
		ids := make([]string, len(due))
		byEvent := make(map[string]string, len(due))
		since := due[0].AcceptedAt
		for i, r := range due {
			ids[i] = r.EventID
			byEvent[r.EventID] = r.HistoryID
			if r.AcceptedAt.Before(since) {
				since = r.AcceptedAt
			}
		}
		present, err := s.cfg.Warehouse.Present(ctx, ws, target.Generation, ids, since)
		if err != nil {
			return res, fmt.Errorf("look up %d events: %w", len(ids), err)
		}
		res.Rounds++
		res.Checked += len(due)
		found := map[string]bool{}
		var verified []string
		for _, id := range present {
			if h, ok := byEvent[id]; ok && !found[id] {
				found[id] = true
				verified = append(verified, h)
			}
		}
		var absent []string
		for _, r := range due {
			if !found[r.EventID] {
				absent = append(absent, r.HistoryID)
			}
		}
		n, err := st.Verify(ctx, target, verified)
		if err != nil {
			return res, err
		}
		res.Verified += int(n)
		requeued, err := st.Retry(ctx, target, absent)
		if err != nil {
			return res, err
		}
		res.Retried += len(absent)
		res.Requeued += len(requeued)
		res.RequeuedRepeatedly = append(res.RequeuedRepeatedly, s.countRequeues(ws.ID, target, requeued)...)
		if len(due) < store.MaxVerifyBatch {
			return res, nil
		}
		if !target.UsesDelivery() && n == 0 && len(requeued) == 0 {
			// The legacy read returns every unverified receipt, not only due
			// ones; a round that changed nothing would repeat itself.
			return res, nil
		}
	}
	return res, nil
}

// Sweep publishes up to maxBatches batches of a workspace's pending events:
// those no wake-up will come for (sent back by a retry, a replay or a
// backfill). It is the drain, repeated while more is pending. It returns how
// many events were published.
func (s *Service) Sweep(ctx context.Context, workspaceID string, maxBatches int) (int, error) {
	published := 0
	for range maxBatches {
		if ctx.Err() != nil {
			return published, nil
		}
		res, err := s.Drain(ctx, workspaceID)
		published += res.Published
		if err != nil {
			if ctx.Err() != nil {
				return published, nil // out of budget; nothing unacknowledged counts
			}
			return published, err
		}
		if !res.More || res.Published == 0 && res.SetAside == 0 {
			return published, nil
		}
	}
	return published, nil
}

// VerifyAll runs Verify and then Sweep for each workspace (all of the
// registry's when workspaces is empty) within budget, shared fairly: each
// workspace gets the remaining time divided by the workspaces left. One
// workspace's failure does not stop the others; it is reported in its
// result and logged.
func (s *Service) VerifyAll(ctx context.Context, workspaces []string, budget time.Duration, sweepBatches int) []VerifyResult {
	if len(workspaces) == 0 {
		for _, ws := range s.cfg.Registry.Workspaces {
			workspaces = append(workspaces, ws.ID)
		}
	}
	deadline := time.Now().Add(budget)
	results := make([]VerifyResult, 0, len(workspaces))
	for i, id := range workspaces {
		share := time.Until(deadline) / time.Duration(len(workspaces)-i)
		wctx, cancel := context.WithTimeout(ctx, share)
		// Verification gets most of the share; the sweep the rest.
		vctx, vcancel := context.WithTimeout(wctx, share*4/5)
		res, err := s.Verify(vctx, id)
		vcancel()
		if err == nil && res.State == StateActive && sweepBatches > 0 {
			res.Swept, err = s.Sweep(wctx, id, sweepBatches)
		}
		cancel()
		if err != nil {
			res.Error = err.Error()
			s.log.ErrorContext(ctx, "replication verification failed for a workspace", slog.String("workspace", id), slog.Any("error", err))
		}
		results = append(results, res)
	}
	return results
}

// RequeuedEvent is an event the verifier has sent back to pending again and
// again.
type RequeuedEvent struct {
	HistoryID string `json:"history_id"`
	EventID   string `json:"event_id"`
	// Times is how many times this verifier sent it back to pending.
	Times int `json:"times"`
}

// requeueCounts counts, per event, how many times this verifier sent an
// event back to pending. The schema keeps nothing that survives an event's
// requeue and acknowledgement, so the count lives with the verifier
// instance (one Cloud Run instance, kept warm by the schedule) and starts
// again when the instance does; the dead-letter subscription's copies of an
// event are the lasting count. It holds at most maxRequeueCounts events.
type requeueCounts struct {
	mu     sync.Mutex
	counts map[string]int // workspace/generation/history id → times
}

const maxRequeueCounts = 100_000

// countRequeues counts the events a round sent back to pending and returns
// those sent back more than RequeueReportAfter times, logging each.
func (s *Service) countRequeues(workspace string, t store.Target, requeued []string) []RequeuedEvent {
	if len(requeued) == 0 {
		return nil
	}
	var out []RequeuedEvent
	s.requeues.mu.Lock()
	if s.requeues.counts == nil || len(s.requeues.counts) > maxRequeueCounts {
		s.requeues.counts = map[string]int{}
	}
	for _, id := range requeued {
		key := workspace + "/" + t.Generation + "/" + id
		s.requeues.counts[key]++
		if n := s.requeues.counts[key]; n > s.cfg.RequeueReportAfter {
			out = append(out, RequeuedEvent{HistoryID: id, EventID: event.ID(t.SourceID, id, t.Generation), Times: n})
		}
	}
	s.requeues.mu.Unlock()
	for _, e := range out {
		s.log.Error("replication event sent back to pending again and again: it keeps not landing in BigQuery (see job dead-letter)",
			slog.String("workspace", workspace), slog.String("generation", t.Generation), slog.String("history_id", e.HistoryID),
			slog.String("event_id", e.EventID), slog.Int("times", e.Times))
	}
	return out
}
