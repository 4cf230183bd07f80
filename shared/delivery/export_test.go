package delivery

// What only the tests call.

import (
	"context"
	"time"

	"github.com/segmentstream/ontology-replication/shared/registry"
)

// Sweep publishes up to maxBatches batches of a workspace's pending events:
// those no wake-up will come for (sent back by a retry, a replay or a
// backfill). It is the drain, on claims of its own outside the wake-ups'
// turns, repeated while more is pending. It returns how
// many events were published.
func (s *Service) Sweep(ctx context.Context, workspaceID string, maxBatches int) (int, error) {
	return s.sweep(ctx, workspaceID, maxBatches, time.Time{})
}

// Verify runs verification rounds for one workspace until nothing is due or
// ctx ends: take up to 1,000 due accepted events, look them up in one
// warehouse query, mark the present verified and retry the absent (checked
// ones only). A failed lookup changes nothing for its round. Ids the lookup
// returns that were not asked for are ignored. Running out of time is not a
// failure: what committed stays, the rest is due again.
func (s *Service) Verify(ctx context.Context, workspaceID string) (VerifyResult, error) {
	ws, err := s.Workspace(workspaceID)
	if err != nil {
		return VerifyResult{Workspace: workspaceID, Outcome: OutcomeFailed, Error: err.Error(), Cause: CauseInternal}, err
	}
	u := s.newUnit([]registry.Workspace{ws})
	u.verify(ctx, time.Time{})
	failUnanswered([]*unit{u})
	res := u.members[0].res
	if res.Error != "" {
		return res, u.members[0].err
	}
	return res, nil
}
