package delivery

import (
	"cmp"
	"context"
	"fmt"

	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/store"
)

// RepairOptions chooses what a repair mends.
type RepairOptions struct {
	AuditOptions
	// Drain configures the drain that publishes what the repair sent back
	// to pending.
	Drain DrainAllOptions
}

// RepairReport is what a repair did.
type RepairReport struct {
	// Audit is the audit the repair mended.
	Audit AuditReport `json:"audit"`
	// Reset counts the events sent back to pending, Verified how many of
	// them had been verified.
	Reset    int `json:"reset"`
	Verified int `json:"reset_verified"`
	// Drain is the drain that published them (and anything else pending).
	Drain DrainAllResult `json:"drain"`
}

// Repair audits the workspace (or the chosen records) and re-delivers what
// the warehouse lacks: the source's latest event of every record missing,
// stale or deleted at the source, by sending its delivery row back to
// pending (store.Redeliver, the replay page's reset over chosen rows of the
// active generation only), then drains. It never deletes warehouse data:
// records only the warehouse has are reported. A repair stopped at any
// point is resumed by running it again (the events it reset are in flight,
// and the drain publishes them); once they have landed and been verified,
// a new repair finds nothing to re-deliver.
func (s *Service) Repair(ctx context.Context, workspaceID string, opts RepairOptions) (RepairReport, error) {
	var rep RepairReport
	held, err := s.hold(ctx, workspaceID)
	if err != nil {
		return rep, err
	}
	defer held()
	err = s.onActiveTarget(ctx, workspaceID, func(ws registry.Workspace, st *store.Store, t store.Target) error {
		audit, err := s.audit(ctx, ws, st, t, opts.AuditOptions)
		rep.Audit = audit
		if err != nil {
			return err
		}
		progress := cmp.Or[Progress](opts.Drain.Progress, NoProgress{})
		tracker := progress.Start("repair", workspaceID, "events", int64(len(audit.repair)))
		defer func() { tracker.Done(err) }()
		for start := 0; start < len(audit.repair); start += store.RedeliverPageSize {
			if ctx.Err() != nil {
				err = fmt.Errorf("%w: %w", ErrInterrupted, context.Cause(ctx))
				return err
			}
			page := audit.repair[start:min(start+store.RedeliverPageSize, len(audit.repair))]
			var done store.Redelivered
			err = s.retrying(ctx, "repair", workspaceID, func() (err error) {
				done, err = st.Redeliver(ctx, t, page)
				return err
			})
			if err != nil {
				return err
			}
			rep.Reset += done.Rows
			rep.Verified += done.Verified
			tracker.Add(len(page))
		}
		s.log.InfoContext(ctx, "replication: repair re-delivers",
			"workspace", workspaceID, "generation", t.Generation, "differences", audit.Differences,
			"repairable", audit.Repairable, "reset", rep.Reset, "reset_verified", rep.Verified)
		return nil
	})
	if err != nil {
		return rep, err
	}
	rep.Drain, err = s.DrainAll(ctx, workspaceID, opts.Drain)
	return rep, err
}
