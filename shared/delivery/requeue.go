package delivery

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentstream/ontology-replication/shared/registry"
)

// LogDrainRequeues is the warning of a drain that meets a transient fault
// and goes on: it queues for its turn again after backoff_ms, its commits
// (and those coalesced into it) still its own, or, with handed_over, leaves
// them to its process's pending drain. cause and error say what it met.
const LogDrainRequeues = "replication: the drain queues again after a transient fault"

// The backoff between a drain's queueings after a transient fault.
const (
	requeueBackoff    = 100 * time.Millisecond
	maxRequeueBackoff = 2 * time.Second
)

// mayRequeue reports whether a drain that started at started may queue
// again after backoff: within Config.RequeueFor of its start and ctx's
// deadline, with time left for a batch.
func (s *Service) mayRequeue(ctx context.Context, started time.Time, backoff time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	end := started.Add(s.cfg.RequeueFor)
	if deadline, ok := ctx.Deadline(); ok && deadline.Before(end) {
		end = deadline
	}
	return time.Until(end) > backoff+minRequeueWork
}

// minRequeueWork is the least time a drain that queues again must have
// left after its backoff.
const minRequeueWork = time.Second

// sleepCtx waits d, or until ctx ends (false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// logRequeue is the warning of a drain that met a transient fault and goes
// on, or hands over to its process's pending drain.
func (s *Service) logRequeue(ctx context.Context, ws registry.Workspace, err error, handedOver bool, backoff time.Duration) {
	s.log.WarnContext(ctx, LogDrainRequeues, slog.String("workspace", ws.ID), slog.String("cause", Cause(err)),
		slog.Bool("handed_over", handedOver), slog.Int64("backoff_ms", backoff.Milliseconds()), slog.String("error", err.Error()))
}

// requeueAfter is a drain's pause after a transient fault err, holding its
// process's pending place: logged, the place marked retrying (a wake-up
// coalesced meanwhile is answered ErrDrainRetrying) for backoff; false when
// ctx ended first.
func (s *Service) requeueAfter(ctx context.Context, ws registry.Workspace, err error, pending *pendingDrain, backoff time.Duration, res *DrainResult) bool {
	s.logRequeue(ctx, ws, err, false, backoff)
	res.Requeued++
	pending.setRetrying(true)
	if !sleepCtx(ctx, backoff) {
		return false
	}
	pending.setRetrying(false)
	return true
}

// LogDrainLeavesHeld is the warning of a drain whose last claim found
// pending events held by other claims, and took nothing, for as long as
// it may queue again (Config.RequeueFor): it leaves them to those claims.
// Should such a claim's process have frozen, they wait for the next
// wake-up or the verifier's sweep once the server has ended its session.
const LogDrainLeavesHeld = "replication: the drain leaves pending events to other claims that still hold them"

// awaitHeld is a drain's pause, holding its process's pending place, after
// a claim that took nothing because other claims held the pending events
// (held of them): it claims again after backoff, as those claims end,
// published or not (a claim whose session is ending, or whose process
// froze, holds its events until the server has ended it). It fails only
// when ctx ends first.
func (s *Service) awaitHeld(ctx context.Context, ws registry.Workspace, held int, backoff time.Duration) error {
	s.log.DebugContext(ctx, "replication: the drain's pending events are held by other claims; it claims again",
		slog.String("workspace", ws.ID), slog.Int("held", held), slog.Int64("backoff_ms", backoff.Milliseconds()))
	if !sleepCtx(ctx, backoff) {
		return fmt.Errorf("delivery: wait for other claims' %d events: %w", held, context.Cause(ctx))
	}
	return nil
}

// logLeftHeld is the warning of a drain that leaves held events to the
// claims that hold them (LogDrainLeavesHeld).
func (s *Service) logLeftHeld(ctx context.Context, ws registry.Workspace, held int) {
	s.log.WarnContext(ctx, LogDrainLeavesHeld, slog.String("workspace", ws.ID), slog.Int("held", held))
}
