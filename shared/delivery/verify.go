package delivery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/segmentstream/ontology-replication/shared/event"
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
	// Error is the failure that ended this workspace's run, if any.
	Error string `json:"error,omitempty"`
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
		return VerifyResult{Workspace: workspaceID, Outcome: OutcomeFailed, Error: err.Error()}, err
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
		s.log.WarnContext(ctx, "replication verification: the pass's budget did not reach every workspace; the next pass starts with them",
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

// unit is workspaces verified together: those sharing an events table.
type unit struct {
	svc     *Service
	members []*member
	lookups int
	shared  int
	// answered counts the lookups BigQuery answered.
	answered int
}

// member is one workspace of a unit, during its verification.
type member struct {
	ws     registry.Workspace
	target store.Target
	res    VerifyResult
	err    error
	done   bool
	// lookupErr is the failed lookup that the pass's deadline cut, which
	// leaves the member partial unless no lookup of the pass was answered
	// (see failUnanswered).
	lookupErr error
}

// holdPools keeps the unit's pools open for its whole verification, so that
// its rounds, sweep and figures share their connections instead of opening
// them again where pools close when idle (the job's). It takes all of them
// or, when the bound on open pools leaves no room for all, none
// (database.Pools.TryAcquireAll): then withStore takes them one at a time
// and a unit never waits on itself or on another unit that holds pools.
func (u *unit) holdPools(ctx context.Context) func() {
	wss := make([]registry.Workspace, len(u.members))
	for i, m := range u.members {
		wss[i] = m.ws
	}
	leases := u.svc.cfg.Pools.TryAcquireAll(ctx, wss)
	return func() {
		for _, l := range leases {
			l.Release()
		}
	}
}

// withStore runs f with the member's store, holding its workspace's pool
// meanwhile (the unit may hold it longer: see holdPools). A unit takes its
// members' pools one at a time here, so that a bound on open pools (the
// job's --parallel) cannot leave it waiting on itself.
func (m *member) withStore(ctx context.Context, s *Service, f func(*store.Store) error) error {
	l, err := s.lease(ctx, m.ws)
	if err != nil {
		return err
	}
	defer l.Release()
	return f(l.store)
}

func (s *Service) newUnit(members []registry.Workspace) *unit {
	u := &unit{svc: s}
	for _, ws := range members {
		u.members = append(u.members, &member{ws: ws, res: VerifyResult{Workspace: ws.ID}})
	}
	return u
}

// failUnanswered makes a failure of the members whose lookup the deadline
// cut when BigQuery answered no lookup of the pass: an outage must never
// read as a pass that merely ran out of time. Partial means that some work
// was done and the rest ran out of time.
func failUnanswered(units []*unit) {
	for _, u := range units {
		if u.answered > 0 {
			return
		}
	}
	for _, u := range units {
		for _, m := range u.members {
			if m.lookupErr != nil && m.res.Outcome == OutcomePartial {
				m.err = fmt.Errorf("BigQuery answered no lookup of the pass: %w", m.lookupErr)
				m.res.Outcome, m.res.Error = OutcomeFailed, m.err.Error()
			}
		}
	}
}

func (u *unit) notReached() {
	for _, m := range u.members {
		m.res.Outcome = OutcomeNotReached
	}
}

// fail ends a member's verification with err, unless it is the unit's time
// running out, which leaves it partial.
func (m *member) fail(ctx context.Context, err error) {
	m.done = true
	if ctx.Err() != nil {
		m.res.Outcome = OutcomePartial
		return
	}
	m.err = err
	m.res.Outcome, m.res.Error = OutcomeFailed, err.Error()
}

// verify runs the unit's rounds until no member has events due, ctx ends
// or it is time to start no more rounds (the zero time: no such time): each
// round takes up to 1,000 due events of every member, looks them all up in
// one query, and verifies and retries each member's.
func (u *unit) verify(ctx context.Context, startBefore time.Time) {
	s := u.svc
	for _, m := range u.members {
		if s.cfg.Warehouse == nil {
			m.fail(ctx, errors.New("delivery: no warehouse configured for verification"))
			continue
		}
		var t store.Target
		err := m.withStore(ctx, s, func(l *store.Store) (err error) {
			_, t, err = l.ActiveTarget(ctx)
			return err
		})
		switch {
		case errors.Is(err, store.ErrNoActiveTarget):
			m.done, m.res.State, m.res.Outcome = true, StateNoActiveTarget, OutcomeInactive
		case err != nil:
			m.fail(ctx, err)
		default:
			m.target, m.res.Generation, m.res.State = t, t.Generation, StateActive
		}
	}
	for {
		type due struct {
			m    *member
			refs []store.Ref
		}
		var round []due
		var lookups []warehouse.Lookup
		for _, m := range u.members {
			if m.done {
				continue
			}
			if ctx.Err() != nil || !startBefore.IsZero() && time.Now().After(startBefore) {
				m.done, m.res.Outcome = true, OutcomePartial
				continue
			}
			var refs []store.Ref
			err := m.withStore(ctx, s, func(l *store.Store) (err error) {
				refs, err = l.DueUnverified(ctx, m.target)
				return err
			})
			if err != nil {
				m.fail(ctx, err)
				continue
			}
			if len(refs) == 0 {
				m.done, m.res.Outcome = true, OutcomeVerified
				continue
			}
			l := warehouse.Lookup{Generation: m.target.Generation, AcceptedSince: refs[0].AcceptedAt}
			for _, r := range refs {
				l.EventIDs = append(l.EventIDs, r.EventID)
				if r.AcceptedAt.Before(l.AcceptedSince) {
					l.AcceptedSince = r.AcceptedAt
				}
			}
			round = append(round, due{m, refs})
			lookups = append(lookups, l)
		}
		if len(round) == 0 {
			return
		}
		started := time.Now()
		present, err := s.cfg.Warehouse.Present(ctx, round[0].m.ws.BigQuery, lookups)
		took := time.Since(started)
		u.lookups++
		if err == nil {
			u.answered++
		}
		u.shared += len(round) - 1
		found := make(map[string]bool, len(present))
		for _, id := range present {
			found[id] = true
		}
		for _, d := range round {
			m := d.m
			m.res.LookupTime += took
			if err != nil {
				m.lookupErr = fmt.Errorf("look up %d events: %w", len(d.refs), err)
				m.fail(ctx, m.lookupErr)
				continue
			}
			m.res.Rounds++
			m.res.Checked += len(d.refs)
			var verified, absent []string
			for _, r := range d.refs {
				if found[r.EventID] {
					verified = append(verified, r.HistoryID)
				} else {
					absent = append(absent, r.HistoryID)
				}
			}
			var n int64
			var requeued []string
			err := m.withStore(ctx, s, func(l *store.Store) (err error) {
				if n, err = l.Verify(ctx, m.target, verified); err != nil {
					return err
				}
				requeued, err = l.Retry(ctx, m.target, absent)
				return err
			})
			if err != nil {
				m.fail(ctx, err)
				continue
			}
			m.res.Verified += int(n)
			m.res.Retried += len(absent)
			m.res.Requeued += len(requeued)
			m.res.RequeuedRepeatedly = append(m.res.RequeuedRepeatedly, s.countRequeues(m.ws.ID, m.target, requeued)...)
			if len(d.refs) < store.MaxVerifyBatch || (!m.target.UsesDelivery() && n == 0 && len(requeued) == 0) {
				// Nothing more is due (the legacy read returns every
				// unverified receipt, not only due ones: a round that
				// changed nothing would repeat itself).
				m.done, m.res.Outcome = true, OutcomeVerified
			}
		}
	}
}

// figures reads each active member's figures after its verification.
func (u *unit) figures(ctx context.Context) {
	for _, m := range u.members {
		if m.res.State != StateActive || m.res.Outcome == OutcomeFailed || ctx.Err() != nil {
			continue
		}
		var f store.Figures
		err := m.withStore(ctx, u.svc, func(l *store.Store) (err error) {
			f, err = l.Figures(ctx, m.target)
			return err
		})
		switch {
		case err == nil:
			m.res.Figures = &f
		case !errors.Is(err, store.ErrNoFigures) && ctx.Err() == nil:
			u.svc.log.WarnContext(ctx, "replication: a workspace's figures could not be read", slog.String("workspace", m.ws.ID), slog.String("error", err.Error()))
		}
	}
}

// Messages of the verifier's log lines: the log-based metrics of terraform
// select them (a test checks that the filters and these agree).
const (
	// LogVerifyWorkspace is a workspace's line in a pass: its outcome,
	// what it verified, and its figures (lags and backlogs).
	LogVerifyWorkspace = "replication verify workspace"
)

// A Band is one of the bands a lag is reported in.
type Band struct {
	// Name is the band's label value, such as "under_5m".
	Name string
	// Under is the band's upper bound (exclusive); zero for the last
	// band, which has none.
	Under time.Duration
}

// LagBands returns the bands a lag is reported in on the verifier's lines
// (as labels of a counter, which costs a sixth of a distribution in Cloud
// Monitoring), shortest first: each names the bound it is under, the last
// one is over the last bound.
func LagBands() []Band {
	return []Band{
		{"under_1m", time.Minute}, {"under_5m", 5 * time.Minute}, {"under_15m", 15 * time.Minute},
		{"under_30m", 30 * time.Minute}, {"under_1h", time.Hour}, {"over_1h", 0},
	}
}

// LagBand returns the band of a lag.
func LagBand(d time.Duration) string {
	bands := LagBands()
	for _, b := range bands {
		if b.Under == 0 || d < b.Under {
			return b.Name
		}
	}
	return bands[len(bands)-1].Name
}

// logWorkspace writes a workspace's line of a pass: at ERROR when it
// failed, WARN when it was not reached, INFO otherwise.
func (s *Service) logWorkspace(ctx context.Context, r VerifyResult) {
	level := slog.LevelInfo
	switch r.Outcome {
	case OutcomeFailed:
		level = slog.LevelError
	case OutcomeNotReached:
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{
		slog.String("workspace", r.Workspace), slog.String("outcome", r.Outcome),
		slog.Int("rounds", r.Rounds), slog.Int("checked", r.Checked), slog.Int("verified", r.Verified),
		slog.Int("retried", r.Retried), slog.Int("requeued", r.Requeued), slog.Int("swept", r.Swept),
		slog.Float64("lookup_seconds", r.LookupTime.Seconds()),
	}
	if r.Generation != "" {
		attrs = append(attrs, slog.String("generation", r.Generation))
	}
	if f := r.Figures; f != nil {
		pending, unverified := f.Ages(time.Now())
		attrs = append(attrs, slog.Int64("pending", f.Pending), slog.Int64("set_aside", f.SetAside),
			slog.Int64("unverified", f.Unverified), slog.Int64("due_verifications", f.DueVerifications),
			slog.Float64("oldest_pending_age_seconds", pending.Seconds()), slog.Float64("oldest_unverified_age_seconds", unverified.Seconds()),
			slog.Float64("outstanding_age_seconds", max(pending, unverified).Seconds()), slog.Bool("figures_capped", f.Capped),
			slog.String("delivery_lag_band", LagBand(pending)), slog.String("verification_lag_band", LagBand(unverified)),
			slog.String("outstanding_band", LagBand(max(pending, unverified))))
	}
	if r.Error != "" {
		attrs = append(attrs, slog.String("error", r.Error))
	}
	s.log.LogAttrs(ctx, level, LogVerifyWorkspace, attrs...)
}

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

// Sweep publishes up to maxBatches batches of a workspace's pending events:
// those no wake-up will come for (sent back by a retry, a replay or a
// backfill). It is the drain, repeated while more is pending. It returns how
// many events were published.
func (s *Service) Sweep(ctx context.Context, workspaceID string, maxBatches int) (int, error) {
	return s.sweep(ctx, workspaceID, maxBatches, time.Time{})
}

func (s *Service) sweep(ctx context.Context, workspaceID string, maxBatches int, startBefore time.Time) (int, error) {
	published := 0
	for range maxBatches {
		if ctx.Err() != nil || !startBefore.IsZero() && time.Now().After(startBefore) {
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
