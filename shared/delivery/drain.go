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
	// HandedOver reports that the drain left what was still pending to a
	// drain that claims after it (see Drain).
	HandedOver bool `json:"handed_over,omitempty"`
	// Requeued is how many times the drain queued for its turn again after
	// a transient fault (see Drain).
	Requeued int `json:"requeued,omitempty"`
	// Waited is how long the wake-up waited in the server for the drains
	// ahead of it: for the next turn, and in its claim for the turn.
	Waited time.Duration `json:"-"`
	// Held is how many pending events the drain's last claim found held by
	// other claims, which it left to them (see Drain).
	Held int `json:"-"`
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
	r.More, r.Held = b.More, b.Held
	r.Requests += b.Requests
	r.PublishTime += b.PublishTime
	if b.Published > 0 || b.SetAside > 0 {
		r.Batches++
	}
}

// Drain is a wake-up of a workspace's drain: the ontology service sends one
// after every commit, and never again for that commit. Its 2xx answer is a
// promise: the commit is published by a drain that is in flight (this one,
// or the one it was coalesced into), never left to a later wake-up or the
// verifier's sweep, whatever that drain meets (see "A wake-up's word" in
// the package doc).
//
// On a quiet workspace (this process's wake-ups of it come less often than
// one per Config.QuietInterval) a wake-up claims on its own. On a busy one
// the wake-ups of the workspace coalesce. In this process, a wake-up that
// finds a drain of its workspace that has not claimed yet (the process's
// pending drain) leaves its events to that drain and publishes nothing
// (Coalesced), without a statement; while that drain waits to queue again
// after a transient fault, such a wake-up is answered with
// ErrDrainRetrying (503: the SDK logs it as deferred), its commit still
// left to that drain. Otherwise it is the process's pending drain: across
// every instance the drains meet at the workspace's database
// (store.QueueTurn), one statement that takes the next turn, or waits for
// it first (at most Config.TurnWait); the drain gathers commits for
// Config.Gather (on its first claim), then claims, and its claim waits for
// the turn if another drain still holds it (at most Config.TurnWait too).
// So a busy workspace costs the database a few statements per claim, not
// one per wake-up. A drain with the turn publishes one batch of the oldest
// pending events (disjoint from other claims, holding no lock the SDK waits
// on) as one Pub/Sub request and acknowledges it only after Pub/Sub
// accepted it. An event that cannot be published is set aside and the
// others go on. When replication is disabled or has no active target it
// publishes nothing and reports the state. A claim that took nothing
// because other claims held the pending events is followed by another
// after a backoff, until none is held (see "A wake-up's word" in the
// package doc).
//
// While more are pending after its batch, a drain goes on (drainTurns): it
// takes its process's pending place again and queues for its turn, or,
// when its process has a pending drain already, hands the rest over to it
// (HandedOver): that drain claims as soon as this one's turn ends. After
// Config.DrainFor, counted from its first claim, it also hands over to a
// drain that has claimed after it (it holds the next turn and finds the
// turn held), unless wake-ups were coalesced into it meanwhile. A drain
// that meets a transient fault (its turn's wait past its bound, a lost
// session, the lifecycle lock held by a migration, Pub/Sub unavailable)
// queues again after a backoff (Requeued), for up to Config.RequeueFor
// from its start and within ctx's deadline, or hands over to its process's
// pending drain; only then does it fail.
func (s *Service) Drain(ctx context.Context, workspaceID string) (DrainResult, error) {
	ws, err := s.Workspace(workspaceID)
	if err != nil {
		return DrainResult{Workspace: workspaceID}, err
	}
	started := time.Now()
	res := DrainResult{Workspace: ws.ID}
	local := s.turns.of(ws.ID)
	local.arrived(started)
	// On a quiet workspace a wake-up claims on its own, as the drain did
	// before its wake-ups coalesced: no turn to take, nothing to gather,
	// and no drain counts on it (a wake-up is coalesced only into a pending
	// drain, which claims after it).
	quiet := s.cfg.QuietInterval > 0 && local.interval() >= s.cfg.QuietInterval
	var pending *pendingDrain
	var joined, retrying bool
	if quiet {
		joined, retrying = local.join()
	} else {
		pending, joined, retrying = local.enterOrJoin()
	}
	if joined {
		// A drain of this process has not claimed yet: its claim takes
		// this wake-up's events.
		res.Coalesced, res.CoalescedBy = true, "instance"
		if retrying {
			return res, ErrDrainRetrying
		}
		return res, nil
	}
	st, err := s.lease(ctx, ws)
	if err != nil {
		pending.leave()
		return res, err
	}
	defer st.Release()
	backoff := requeueBackoff
	if quiet {
		state, target, claim, err := st.store.ClaimActive(ctx)
		batch, err := s.drainClaim(ctx, ws, state, target, claim, err)
		res.add(batch)
		switch {
		case err == nil && !batch.goesOn():
			return res, nil
		case err != nil && (!Transient(err) || !s.mayRequeue(ctx, started, backoff)):
			return res, err
		}
		// More are pending than its batch took, other claims held some, or
		// it met a transient fault (a connection lost, say): it goes on
		// through the turns, or leaves them to its process's pending drain.
		if pending = local.enter(); pending == nil {
			if err != nil {
				s.logRequeue(ctx, ws, err, true, backoff)
			}
			res.HandedOver = true
			return res, nil
		}
		if err != nil {
			if !s.requeueAfter(ctx, ws, err, pending, backoff, &res) {
				pending.leave()
				return res, err
			}
			backoff = min(2*backoff, maxRequeueBackoff)
		}
	}
	return res, s.drainTurns(ctx, st, ws, local, pending, started, backoff, &res)
}

// goesOn reports that a drain goes on after this batch: more were pending
// than it took, and it published or set aside something (a claim that took
// nothing found the others held by other drains); or other claims held
// pending events, which it claims again as they end (see awaitHeld).
func (r DrainResult) goesOn() bool {
	return r.Held > 0 || (r.More && (r.Published > 0 || r.SetAside > 0))
}

// drainTurns is a busy drain from its process's pending place (pending) to
// its end (see Drain): claim after claim on its turns while more are
// pending, queueing again after a transient fault, until nothing is left
// at its last claim or it hands what is left over to a drain that claims
// after it.
func (s *Service) drainTurns(ctx context.Context, st *workspaceLease, ws registry.Workspace, local *localTurn, pending *pendingDrain,
	started time.Time, backoff time.Duration, res *DrainResult) error {
	defer func() { pending.leave() }()
	var until time.Time // Config.DrainFor after its first claim
	heldBackoff := requeueBackoff
	for gather := true; ; gather = false {
		// It holds its process's pending place here.
		turn, err := st.store.QueueTurn(ctx, s.cfg.TurnWait)
		if err == nil && !until.IsZero() && !time.Now().Before(until) && turn.Role() == store.TurnNext && pending.leaveIfAlone() {
			// Past its time, and the drain that holds the turn claimed
			// after its last claim, and so takes whatever it left.
			turn.End(ctx)
			res.HandedOver = true
			return nil
		}
		var batch DrainResult
		if err == nil {
			err = s.awaitTurn(ctx, turn, pending, gather)
		}
		if err == nil {
			var state store.State
			var target store.Target
			var claim *store.Claim
			state, target, claim, err = s.claimTurn(ctx, turn, local, res)
			if until.IsZero() {
				until = time.Now().Add(s.cfg.DrainFor)
			}
			batch, err = s.drainClaim(ctx, ws, state, target, claim, err)
			res.add(batch)
		}
		waitHeld := err == nil && batch.Held > 0 && batch.Published == 0 && batch.SetAside == 0
		switch {
		case waitHeld && !s.mayRequeue(ctx, started, heldBackoff):
			s.logLeftHeld(ctx, ws, batch.Held)
			return nil
		case err == nil && !batch.goesOn():
			return nil
		case err != nil && (!Transient(err) || !s.mayRequeue(ctx, started, backoff)):
			return err
		}
		// It goes on: from its process's pending place, or it hands over to
		// the drain that holds it (which claims when this turn has ended).
		if !pending.holds() {
			pending = local.enter()
		}
		if pending == nil {
			if err != nil {
				s.logRequeue(ctx, ws, err, true, backoff)
			}
			res.HandedOver = true
			return nil
		}
		if err != nil {
			if !s.requeueAfter(ctx, ws, err, pending, backoff, res) {
				return err
			}
			backoff = min(2*backoff, maxRequeueBackoff)
		}
		if waitHeld {
			if err := s.awaitHeld(ctx, ws, batch.Held, heldBackoff); err != nil {
				return err
			}
			heldBackoff = min(2*heldBackoff, maxRequeueBackoff)
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

// probeBeside drains one batch beside a claim whose lone event failed
// alone (see publishClaim), on a connection it reserves first without
// waiting for one (probeReserveWait at most): a drain of this process that
// claims soon may hold the pool's other connection while it waits for
// this claim's turn, and a probe that waited for that connection would wait
// for it until that drain's wait timed out. Once it has its connection, it
// leaves the events to such a drain, if there is one (it claims as soon as
// this claim ends); a drain that comes after the check waits for the
// probe's connection in the pool, holding no lock, and so for one batch.
// The reservation's bound leaves time to open a connection, not to wait
// for one that a drain holds while it waits in the server.
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
	if s.turns.of(ws.ID).claimsSoon() {
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
