package delivery

import (
	"context"
	"fmt"
	"time"
)

// sweep publishes up to batches batches of each verified member's pending
// events (those no wake-up will come for), starting none after
// startBefore.
func (u *unit) sweep(ctx context.Context, batches int, startBefore time.Time) {
	for _, m := range u.members {
		if m.res.State != StateActive || m.res.Outcome == OutcomeFailed {
			continue
		}
		n, err := u.svc.sweep(ctx, m.ws.ID, batches, startBefore)
		m.res.Swept += n
		if err != nil && ctx.Err() == nil {
			m.fail(ctx, fmt.Errorf("sweep: %w", err))
		}
	}
}

func (s *Service) sweep(ctx context.Context, workspaceID string, maxBatches int, startBefore time.Time) (int, error) {
	published := 0
	for range maxBatches {
		if ctx.Err() != nil || !startBefore.IsZero() && time.Now().After(startBefore) {
			return published, nil
		}
		res, err := s.drainOnce(ctx, workspaceID)
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
