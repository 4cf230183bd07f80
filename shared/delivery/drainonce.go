package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/store"
)

// Replication states a drain reports.
const (
	StateActive         = "active"
	StateDisabled       = "disabled"
	StateNoActiveTarget = "no_active_target"
)

// DrainResult is what one claim's drain did (the verifier's sweep and a
// protocol-3 bulk drain drain one batch at a time: drainOnce).
type DrainResult struct {
	Workspace  string `json:"workspace"`
	Generation string `json:"generation,omitempty"`
	// State is active, disabled or no_active_target.
	State string `json:"state,omitempty"`
	// Published is how many events Pub/Sub accepted and were acknowledged,
	// in Batches batches (one Publish request each, bisection aside).
	Published int `json:"published"`
	Batches   int `json:"batches"`
	// More reports that more pending events followed the last batch.
	More bool `json:"more"`
	// Bytes is the published events' size as the SDK counts a batch.
	Bytes int `json:"bytes"`
	// SetAside is how many events of the batch could not be published and
	// were set aside with a backoff (they stay pending; the error log and
	// `job status` name them).
	SetAside int `json:"set_aside,omitempty"`
	// Held is how many pending events the claim found held by other
	// claims, which it left to them.
	Held int `json:"-"`
	// Requests is how many Publish requests the drain sent.
	Requests int `json:"-"`
	// PublishTime is the time spent in Publish requests.
	PublishTime time.Duration `json:"-"`
}

// drainOnce publishes at most one batch of a workspace's pending events,
// on a claim of its own, outside the turns (the verifier's sweep and the
// bulk drain of a legacy database, which drain what no wake-up will come
// for, alongside the wake-ups' drains).
func (s *Service) drainOnce(ctx context.Context, workspaceID string) (DrainResult, error) {
	ws, err := s.Workspace(workspaceID)
	if err != nil {
		return DrainResult{Workspace: workspaceID}, err
	}
	st, err := s.lease(ctx, ws)
	if err != nil {
		return DrainResult{Workspace: ws.ID}, err
	}
	defer st.Release()
	state, target, claim, err := st.store.ClaimActive(ctx)
	res, err := s.drainClaim(ctx, ws, state, target, claim, err)
	if res.Published > 0 || res.SetAside > 0 {
		res.Batches = 1
	}
	return res, err
}

// drainClaim publishes what a claim took (the result of ClaimActive or
// Turn.Claim, err included) and reports the state.
func (s *Service) drainClaim(ctx context.Context, ws registry.Workspace, state store.State, target store.Target, claim *store.Claim, err error) (DrainResult, error) {
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
	return s.publishClaim(ctx, ws, target, claim, res, true)
}

// publishClaim publishes a claimed batch, acknowledges what Pub/Sub accepted
// and sets aside what can never be published. When its lone event failed
// alone, more are pending and the failure is not an outage's
// (suspects.worthProbing), it drains the next batch beside it (probe)
// before it lets the event go, unless this process's drainer of the
// workspace runs: it claims those events itself.
func (s *Service) publishClaim(ctx context.Context, ws registry.Workspace, target store.Target, claim *store.Claim, res DrainResult, mayProbe bool) (DrainResult, error) {
	defer claim.Release(ctx)
	res.Held = claim.Held
	if len(claim.Events) == 0 && len(claim.Unpublishable) == 0 {
		return res, nil
	}
	res.More = claim.More
	out := s.publishBatch(ctx, ws, claim)
	res.Requests, res.PublishTime = out.requests, out.elapsed
	if mayProbe && out.failedAlone && !out.othersFailed && len(claim.Events) == 1 && claim.More && out.probe {
		beside, err := s.probeBeside(ctx, ws, claim)
		res.Published, res.SetAside, res.Bytes = beside.Published, beside.SetAside, beside.Bytes
		res.Requests, res.PublishTime = res.Requests+beside.Requests, res.PublishTime+beside.PublishTime
		if err != nil {
			s.log.WarnContext(ctx, "replication: the batch beside an event that failed alone was not drained",
				slog.String("workspace", ws.ID), slog.String("error", err.Error()))
		}
	}
	_, ackErr := claim.Finish(ctx, out.acceptedIDs(), out.aside)
	if ackErr == nil {
		res.Published, res.SetAside = res.Published+len(out.accepted), res.SetAside+len(out.aside)
		if len(out.accepted) > 0 {
			res.Bytes += out.bytes()
		}
		s.asideWritten(ctx, ws, target, out.aside)
	}
	if out.err != nil {
		return res, out.err
	}
	if ackErr != nil {
		// Published but not acknowledged: the events stay pending and are
		// published again later. Duplicates, never a loss.
		return res, fmt.Errorf("acknowledge after publish (the events will be published again): %w", ackErr)
	}
	return res, nil
}

// probeBeside drains one batch beside a claim whose lone event failed
// alone (see publishClaim), on a connection it reserves first without
// waiting for one (probeReserveWait at most): this process's drainer of
// the workspace may hold the pool's other connection. Once it has its
// connection, it leaves the events to that drainer, if one runs (it claims
// them itself).
func (s *Service) probeBeside(ctx context.Context, ws registry.Workspace, claim *store.Claim) (DrainResult, error) {
	st, err := s.lease(ctx, ws)
	if err != nil {
		return DrainResult{}, err
	}
	defer st.Release()
	reserved, err := st.store.Reserve(ctx, probeReserveWait)
	if err != nil {
		return DrainResult{}, nil // no connection free: the events wait for the next claim
	}
	defer reserved.Release()
	if s.drainers.runs(ws.ID) {
		return DrainResult{}, nil
	}
	if err := claim.Narrow(ctx); err != nil {
		return DrainResult{}, err
	}
	return s.probe(ctx, ws, reserved)
}

// probeReserveWait bounds the wait for a probe's connection.
const probeReserveWait = time.Second

// probe drains one batch beside a claim whose lone event failed alone: that
// claim still holds the event, so this claim takes the events behind it,
// which so flow, and whose publishing tells whether Pub/Sub works (see
// suspects). It is a claim of its own outside the turns, as drainOnce's,
// on the connection reserved for it.
func (s *Service) probe(ctx context.Context, ws registry.Workspace, reserved *store.Reserved) (DrainResult, error) {
	state, target, claim, err := reserved.ClaimActive(ctx)
	if err != nil || !state.Enabled || claim == nil {
		return DrainResult{}, err
	}
	return s.publishClaim(ctx, ws, target, claim, DrainResult{Workspace: ws.ID, Generation: target.Generation, State: StateActive}, false)
}
