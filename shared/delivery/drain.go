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

// DrainResult is what one drain did.
type DrainResult struct {
	Workspace  string `json:"workspace"`
	Generation string `json:"generation,omitempty"`
	// State is active, disabled or no_active_target; empty when the drain
	// was coalesced (it read nothing).
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
	// Coalesced reports that this wake-up left its events to a drain of
	// the workspace that had not claimed yet (see Drain) and published
	// nothing itself; CoalescedBy says where it met that drain: "instance"
	// (this process's pending drain, without a statement).
	Coalesced   bool   `json:"coalesced,omitempty"`
	CoalescedBy string `json:"-"`
	// Waited is how long the wake-up waited in the server for the drains
	// ahead of it: for the next turn, and in its claim for the turn.
	Waited time.Duration `json:"-"`
	// Requests is how many Publish requests the drain sent.
	Requests int `json:"-"`
	// PublishTime is the time spent in Publish requests.
	PublishTime time.Duration `json:"-"`
}

// add counts a batch's drain into r.
func (r *DrainResult) add(b DrainResult) {
	r.Generation, r.State = b.Generation, b.State
	r.Published += b.Published
	r.SetAside += b.SetAside
	r.Bytes += b.Bytes
	r.More = b.More
	r.Requests += b.Requests
	r.PublishTime += b.PublishTime
	if b.Published > 0 || b.SetAside > 0 {
		r.Batches++
	}
}

// Drain is a wake-up of a workspace's drain: the ontology service sends one
// after every commit. On a quiet workspace (this process's wake-ups of it
// come less often than one per Config.QuietInterval) a wake-up claims on
// its own.
// On a busy one the wake-ups of the workspace coalesce. In this process, a
// wake-up that finds a drain of its workspace that has not claimed yet
// (the process's pending drain) leaves its events to that drain and
// publishes nothing (Coalesced), without a statement. Otherwise it is the
// process's pending drain: across every instance the drains meet at the
// workspace's database (store.QueueTurn), one statement that takes the
// next turn, or waits for it first (at most Config.TurnWait); the drain
// then claims, and its claim waits for the turn if another drain still
// holds it (at most Config.TurnWait too). So a busy workspace costs the
// database a few statements per claim, not one per wake-up. A drain with
// the turn publishes one batch of the oldest pending events (disjoint from
// other claims, holding no lock the SDK waits on) as one Pub/Sub request
// and acknowledges it only after Pub/Sub accepted it; while more are
// pending it takes a turn again and goes on, for up to Config.DrainFor,
// unless another drain is next (then that one takes them, and this one
// answers). The drain that claims next gathers
// commits for Config.Gather first (see awaitTurn), so that one batch takes
// the commits of several wake-ups. An event that cannot be published is
// set aside and the others go on. When replication is disabled or has no
// active target it publishes nothing and reports the state.
func (s *Service) Drain(ctx context.Context, workspaceID string) (DrainResult, error) {
	ws, err := s.Workspace(workspaceID)
	if err != nil {
		return DrainResult{Workspace: workspaceID}, err
	}
	res := DrainResult{Workspace: ws.ID}
	local := s.turns.of(ws.ID)
	local.arrived(time.Now())
	// On a quiet workspace a wake-up claims on its own, as the drain did
	// before its wake-ups coalesced: no turn to take, nothing to gather,
	// and no drain counts on it (a wake-up is coalesced only into a pending
	// drain, which claims after it).
	quiet := s.cfg.QuietInterval > 0 && local.interval() >= s.cfg.QuietInterval
	var pending *pendingDrain
	if !quiet {
		pending = local.enter()
	}
	if pending == nil && (!quiet || local.waiting()) {
		// A drain of this process has not claimed yet: its claim takes
		// this wake-up's events.
		res.Coalesced, res.CoalescedBy = true, "instance"
		return res, nil
	}
	defer pending.leave() // when it fails before its claim; a no-op after
	st, err := s.lease(ctx, ws)
	if err != nil {
		return res, err
	}
	defer st.Release()
	until := time.Now().Add(s.cfg.DrainFor)
	for first := true; ; first = false {
		var state store.State
		var target store.Target
		var claim *store.Claim
		if quiet {
			state, target, claim, err = st.store.ClaimActive(ctx)
		} else {
			var turn *store.Turn
			// err is the loop's: the claim's error below must reach
			// drainClaim (a := here would shadow it, and a failed claim
			// would be taken for an empty one).
			turn, err = s.takeTurn(ctx, st.store, first)
			if err != nil {
				return res, err
			}
			if turn.Role() == store.TurnCoalesced {
				// Only when it goes on after a batch: another drain is next
				// and takes what is left.
				return res, nil
			}
			if err := s.awaitTurn(ctx, turn, local, pending, first); err != nil {
				return res, err
			}
			state, target, claim, err = s.claimTurn(ctx, turn, local, &res)
		}
		batch, err := s.drainClaim(ctx, ws, state, target, claim, err)
		res.add(batch)
		if err != nil || !batch.More || batch.Published == 0 && batch.SetAside == 0 || !time.Now().Before(until) || ctx.Err() != nil {
			return res, err
		}
	}
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
// and sets aside what can never be published.
// When its lone event failed alone, more are pending and the failure is not
// an outage's (suspects.worthProbing), it drains the next batch beside it
// (probe) before it lets the event go, unless this process has a drain of
// the workspace that claims soon (pending, or its claim waits for the
// turn: see Drain and claimTurn): that drain claims those events as soon as
// this claim ends, and it holds the pool's other connection while it waits
// for this claim's turn, which the probe would wait for until the pending
// drain's wait timed out.
func (s *Service) publishClaim(ctx context.Context, ws registry.Workspace, target store.Target, claim *store.Claim, res DrainResult, mayProbe bool) (DrainResult, error) {
	defer claim.Release(ctx)
	if len(claim.Events) == 0 && len(claim.Unpublishable) == 0 {
		return res, nil
	}
	res.More = claim.More
	out := s.publishBatch(ctx, ws, claim)
	res.Requests, res.PublishTime = out.requests, out.elapsed
	if mayProbe && out.failedAlone && !out.othersFailed && len(claim.Events) == 1 && claim.More && out.probe && !s.turns.of(ws.ID).claimsSoon() {
		beside, err := DrainResult{}, claim.Narrow(ctx)
		if err == nil {
			beside, err = s.probe(ctx, ws)
		}
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
		s.logSetAside(ctx, ws, target, out.aside)
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

// probe drains one batch beside a claim whose lone event failed alone: that
// claim still holds the event, so this claim takes the events behind it,
// which so flow, and whose publishing tells whether Pub/Sub works (see
// suspects). It is a claim of its own outside the turns, as drainOnce's.
func (s *Service) probe(ctx context.Context, ws registry.Workspace) (DrainResult, error) {
	st, err := s.lease(ctx, ws)
	if err != nil {
		return DrainResult{}, err
	}
	defer st.Release()
	state, target, claim, err := st.store.ClaimActive(ctx)
	if err != nil || !state.Enabled {
		return DrainResult{}, err
	}
	return s.publishClaim(ctx, ws, target, claim, DrainResult{Workspace: ws.ID, Generation: target.Generation, State: StateActive}, false)
}
