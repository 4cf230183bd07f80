package delivery

import (
	"cmp"
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// Outcomes of a workspace's verification in a pass.
const (
	// OutcomeVerified: every due event was looked up (or none was due).
	OutcomeVerified = "verified"
	// OutcomePartial: the workspace's share of the budget ran out with
	// events still due; they are due again next pass.
	OutcomePartial = "partial"
	// OutcomeNotReached: the pass's budget ran out before the workspace's
	// turn; the next pass starts with it.
	OutcomeNotReached = "not_reached"
	// OutcomeFailed: see Error.
	OutcomeFailed = "failed"
	// OutcomeInactive: replication has no active target.
	OutcomeInactive = "inactive"
)

// VerifyResult is what one verifier pass did for one workspace.
type VerifyResult struct {
	Workspace  string `json:"workspace"`
	Generation string `json:"generation,omitempty"`
	State      string `json:"state,omitempty"`
	// Outcome is one of the Outcome constants: never a silent success for
	// a workspace that got no round.
	Outcome string `json:"outcome"`
	// Rounds is how many rounds looked events up (up to 1,000 due events
	// each).
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
	// LookupTime is the time spent waiting for BigQuery.
	LookupTime time.Duration `json:"-"`
	// Figures are the workspace's lags and backlogs after the pass (nil
	// when not read: not reached, inactive, failed, or protocol 3).
	Figures *store.Figures `json:"figures,omitempty"`
	// Error is the failure that ended this workspace's run, if any, and
	// Cause its class (see Cause).
	Error string `json:"error,omitempty"`
	Cause string `json:"cause,omitempty"`
}

// The verifier's defaults, which the Verify function, `job verify` and
// VerifyAll all use.
const (
	// DefaultVerifyBudget is a pass's time budget: the scheduler runs a
	// pass every minute.
	DefaultVerifyBudget = 50 * time.Second
	// DefaultSweepBatches is how many pending batches a workspace's sweep
	// publishes at most in a scheduled pass.
	DefaultSweepBatches = 20
	// DefaultVerifyWorkers is how many workspaces (or groups sharing a
	// table) a pass verifies at once.
	DefaultVerifyWorkers = 16
)

// VerifyAllOptions configures a verifier pass.
type VerifyAllOptions struct {
	// Workspaces limits the pass to these workspace ids; empty means every
	// workspace of the registry (of the shard).
	Workspaces []string
	// Shard and Shards split the registry across verifier runs: with
	// Shards > 1 the pass takes the workspaces whose position in id order
	// is Shard modulo Shards.
	Shard, Shards int
	// Budget bounds the whole pass, shared by its workspaces. Default:
	// DefaultVerifyBudget.
	Budget time.Duration
	// SweepBatches is how many pending batches each workspace's sweep
	// publishes at most. Default: 0 (no sweep).
	SweepBatches int
	// Workers is how many workspaces (or groups sharing a table) are
	// verified at once. Default: DefaultVerifyWorkers.
	Workers int
}

// VerifyPass is what a verifier pass did.
type VerifyPass struct {
	// Workspaces has one result per workspace, in the order taken.
	Workspaces []VerifyResult `json:"workspaces"`
	// Lookups is how many BigQuery queries the pass made; SharedLookups is
	// how many workspace rounds were answered by a query of another
	// workspace sharing the table (the queries saved).
	Lookups       int `json:"lookups"`
	SharedLookups int `json:"shared_lookups"`
	// NotReached lists the workspaces the budget did not reach.
	NotReached []string `json:"not_reached,omitempty"`
}

// Failed reports whether any workspace failed or was not reached.
func (p VerifyPass) Failed() bool {
	for _, r := range p.Workspaces {
		if r.Outcome == OutcomeFailed || r.Outcome == OutcomeNotReached {
			return true
		}
	}
	return false
}

// VerifyUnitSize is how many workspaces sharing an events table are
// verified together: their due events are looked up in one query (up to
// 1,000 each, within warehouse.MaxLookupIDs), and their pools are held
// together for the unit's verification.
const VerifyUnitSize = warehouse.MaxLookupIDs / store.MaxVerifyBatch

// minSlice is the least time worth starting a workspace's verification
// with.
const minSlice = 200 * time.Millisecond

// VerifyAll runs a verifier pass: each workspace's verification rounds and
// then its sweep, Workers at a time, within one budget shared fairly (each
// unit of work gets at most its share of what remains, so a slow workspace
// cannot starve the others, and time one does not need goes to the rest).
// Workspaces sharing an events table are verified together, one lookup per
// round for all of them. A workspace the budget does not reach is reported
// as such, and the next pass of this Service starts with it (and with those
// it did not finish). One
// workspace's failure does not stop the others.
func (s *Service) VerifyAll(ctx context.Context, opts VerifyAllOptions) VerifyPass {
	budget := cmp.Or(opts.Budget, DefaultVerifyBudget)
	deadline := time.Now().Add(budget)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	units := s.passUnits(opts)
	var pass VerifyPass
	var mu sync.Mutex
	var g errgroup.Group
	workers := cmp.Or(opts.Workers, DefaultVerifyWorkers)
	g.SetLimit(workers)
	remaining := len(units)
	for _, u := range units {
		g.Go(func() error {
			mu.Lock()
			share := time.Until(deadline) * time.Duration(workers) / time.Duration(max(remaining, 1))
			remaining--
			mu.Unlock()
			if time.Until(deadline) < minSlice {
				u.notReached()
			} else {
				// The slice bounds when the unit may start a round (or a
				// sweep batch); a round started runs to its end within the
				// pass's deadline, so a slow lookup is not cut short and
				// wasted. The rounds get most of the slice, the sweep the
				// rest.
				slice := max(share, minSlice)
				release := u.holdPools(ctx)
				defer release()
				start := time.Now()
				if opts.SweepBatches == 0 {
					u.verify(ctx, start.Add(slice))
				} else {
					u.verify(ctx, start.Add(slice*4/5))
					u.sweep(ctx, opts.SweepBatches, start.Add(slice))
				}
				u.figures(ctx)
			}
			mu.Lock()
			pass.Lookups += u.lookups
			pass.SharedLookups += u.shared
			mu.Unlock()
			return nil
		})
	}
	_ = g.Wait()
	failUnanswered(units)
	var notReached []string
	for _, u := range units {
		for _, m := range u.members {
			pass.Workspaces = append(pass.Workspaces, m.res)
			if m.res.Outcome == OutcomeNotReached {
				notReached = append(notReached, m.ws.ID)
			}
			s.logWorkspace(ctx, m.res)
		}
	}
	pass.NotReached = notReached
	if len(notReached) > 0 {
		s.log.WarnContext(ctx, "replication: verifier: the pass's budget did not reach every workspace; the next pass starts with them",
			slog.Int("not_reached", len(notReached)), slog.Int("workspaces", len(pass.Workspaces)), slog.Duration("budget", budget))
	}
	// Remember when each workspace's verification last came to an end, so
	// that the next pass starts with those that waited longest: the ones
	// this pass did not reach or did not finish.
	s.mu.Lock()
	if s.lastDone == nil {
		s.lastDone = map[string]time.Time{}
	}
	now := time.Now()
	for _, r := range pass.Workspaces {
		switch r.Outcome {
		case OutcomeVerified, OutcomeInactive, OutcomeFailed:
			s.lastDone[r.Workspace] = now
		}
	}
	s.mu.Unlock()
	return pass
}

// passUnits chooses a pass's workspaces, puts first those whose
// verification came to an end longest ago (never, for those no pass reached
// or finished), and groups those sharing an events table into units.
func (s *Service) passUnits(opts VerifyAllOptions) []*unit {
	var chosen []registry.Workspace
	if len(opts.Workspaces) > 0 {
		for _, id := range opts.Workspaces {
			if ws, ok := s.cfg.Registry.Workspace(id); ok {
				chosen = append(chosen, ws)
			}
		}
	} else {
		chosen = Shard(s.cfg.Registry.Workspaces, opts.Shard, opts.Shards)
	}
	s.mu.Lock()
	lastDone := maps.Clone(s.lastDone)
	s.mu.Unlock()
	slices.SortStableFunc(chosen, func(a, b registry.Workspace) int {
		return lastDone[a.ID].Compare(lastDone[b.ID])
	})
	var units []*unit
	byTable := map[string]*unit{}
	for _, ws := range chosen {
		key := warehouse.TableKey(ws.BigQuery)
		u := byTable[key]
		if u == nil || len(u.members) == VerifyUnitSize {
			u = s.newUnit(nil)
			byTable[key] = u
			units = append(units, u)
		}
		u.members = append(u.members, &member{ws: ws, res: VerifyResult{Workspace: ws.ID}})
	}
	return units
}

// Shard returns workspaces whose position in id order is shard modulo
// shards (all of them when shards < 2).
func Shard(all []registry.Workspace, shard, shards int) []registry.Workspace {
	if shards < 2 {
		return slices.Clone(all)
	}
	sorted := slices.Clone(all)
	slices.SortFunc(sorted, func(a, b registry.Workspace) int { return cmp.Compare(a.ID, b.ID) })
	var mine []registry.Workspace
	for i, ws := range sorted {
		if i%shards == shard {
			mine = append(mine, ws)
		}
	}
	return mine
}
