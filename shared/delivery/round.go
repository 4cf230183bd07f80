package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// A pass's unit of work: the workspaces sharing an events table, verified
// together in rounds of one lookup each.

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
				m.res.Outcome, m.res.Error, m.res.Cause = OutcomeFailed, m.err.Error(), Cause(m.lookupErr)
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
	m.res.Outcome, m.res.Error, m.res.Cause = OutcomeFailed, err.Error(), Cause(err)
}

// verify runs the unit's rounds until no member has events due, ctx ends
// or it is time to start no more rounds (the zero time: no such time): each
// round takes up to 1,000 due events of every member, looks them all up in
// one query, and verifies and retries each member's.
func (u *unit) verify(ctx context.Context, startBefore time.Time) {
	u.readTargets(ctx)
	for {
		round, lookups := u.dueRound(ctx, startBefore)
		if len(round) == 0 {
			return
		}
		started := time.Now()
		present, err := u.svc.cfg.Warehouse.Present(ctx, round[0].m.ws.BigQuery, lookups)
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
			d.m.res.LookupTime += took
			if err != nil {
				d.m.lookupErr = fmt.Errorf("look up %d events: %w", len(d.refs), err)
				d.m.fail(ctx, d.m.lookupErr)
				continue
			}
			u.settle(ctx, d, found)
		}
	}
}

// readTargets reads each member's active target.
func (u *unit) readTargets(ctx context.Context) {
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
}

// due is a member's due events in a round.
type due struct {
	m    *member
	refs []store.Ref
}

// dueRound reads each member's due events for one shared lookup; a member
// with none is verified, and one past startBefore (or the pass's end) is
// partial.
func (u *unit) dueRound(ctx context.Context, startBefore time.Time) ([]due, []warehouse.Lookup) {
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
		err := m.withStore(ctx, u.svc, func(l *store.Store) (err error) {
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
	return round, lookups
}

// settle marks a member's looked-up events: those found verified, the
// others retried (sent back to pending when accepted long ago).
func (u *unit) settle(ctx context.Context, d due, found map[string]bool) {
	s, m := u.svc, d.m
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
		if n, err = l.VerifyEvents(ctx, m.target, verified); err != nil {
			return err
		}
		requeued, err = l.RetryUnverified(ctx, m.target, absent)
		return err
	})
	if err != nil {
		m.fail(ctx, err)
		return
	}
	m.res.Verified += int(n)
	m.res.Retried += len(absent)
	m.res.Requeued += len(requeued)
	m.res.RequeuedRepeatedly = append(m.res.RequeuedRepeatedly, s.countRequeues(m.ws.ID, m.target, requeued)...)
	if len(d.refs) < store.MaxVerifyBatch || (!m.target.UsesDelivery() && n == 0 && len(requeued) == 0) {
		// Nothing more is due (the legacy read returns every unverified
		// receipt, not only due ones: a round that changed nothing would
		// repeat itself).
		m.done, m.res.Outcome = true, OutcomeVerified
	}
}

// figures reads each active member's figures after its verification.
func (u *unit) figures(ctx context.Context) {
	for _, m := range u.members {
		// A failed workspace's figures are read too (its database may be
		// reachable when BigQuery is not): its lags keep growing on the
		// pass's lines, and the lag alerts and the SLO see them.
		if m.res.State != StateActive || ctx.Err() != nil || databaseCause(m.res.Cause) {
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

// databaseCause reports whether a failure's cause is the database itself,
// whose figures then cannot be read either.
func databaseCause(cause string) bool {
	switch cause {
	case CauseDatabaseUnavailable, CauseDatabaseDenied, CauseDatabaseBusy:
		return true
	}
	return false
}
