package delivery

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/segmentstream/ontology-replication/shared/publish"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// What an operator's commands read and change (`job status`, `job
// set-aside`, `job views`), in delivery's own types: the shells speak to
// the store only through the Service.

// Errors callers branch on, the store's sentinels under delivery's name.
var (
	// ErrNoActiveTarget: replication has no active generation.
	ErrNoActiveTarget = store.ErrNoActiveTarget
)

// WorkspaceStatus is a workspace's replication state: the protocol, the
// target's completion, its counts as the SDK's replicationStatus gives
// them, its lags and backlogs, and its set-aside events.
type WorkspaceStatus struct {
	// Protocol is the database's replication protocol (3 or 4); Enabled
	// reports whether capture is on.
	Protocol int
	Enabled  bool
	// Generation is the target's (the active one unless asked for
	// another).
	Generation string
	// The target's baseline, backfill and replay: complete or not, and the
	// cursor of the one in progress (JSON, as the target row holds it).
	BaselineComplete bool
	BaselineCursor   json.RawMessage
	BackfillComplete bool
	BackfillCursor   json.RawMessage
	ReplayComplete   bool
	ReplayCursor     *string
	// Total, Accepted and Verified count the target's events as the SDK's
	// replicationStatus does; InitiallyReady is its replicationInitiallyReady.
	Total, Accepted, Verified int64
	InitiallyReady            bool
	// Pending counts the events waiting to be published (set-aside ones
	// apart); OldestPending is when the oldest was queued or sent back
	// (zero when none is, or at protocol 3).
	Pending       int64
	OldestPending time.Time
	// Unverified counts accepted events not verified yet; OldestUnverified
	// is when the oldest was accepted; DueVerifications counts those whose
	// check is due.
	Unverified       int64
	OldestUnverified time.Time
	DueVerifications int64
	// FiguresCapped: the backlog is larger than the bounded reads count, so
	// the counts are lower bounds and the times come from the oldest rows.
	FiguresCapped bool
	// SetAside are the events set aside because they cannot be published.
	SetAside SetAsideReport
	// ReplayProgress is, while a whole-generation replay runs, how far its
	// pages went in each entity's events; BackfillProgress, while a
	// backfill runs, how many of each entity's events (and of the
	// baselines, as entity "baselines") it has enqueued (nil otherwise).
	ReplayProgress, BackfillProgress []EntityProgress
	// LifecycleHeld is a session holding the SDK's lifecycle lock
	// exclusively, which every SDK write waits for (nil: none).
	LifecycleHeld *LifecycleHold
	// TurnsHeld are the sessions that have held the workspace's drain turn
	// or next turn for TurnHeldAfter or longer (a protocol-3 claim's slow
	// batch, or a frozen drainer, which the server ends after the store's
	// IdleTimeout):
	// the wake-ups behind them wait.
	TurnsHeld []TurnHold
	// Sessions are the server's counts of the sessions it opened, in the
	// workspace's database and in all of the server's (connection churn).
	Sessions SessionsOpened
}

// SessionsOpened is what a workspace's server counts of the sessions it
// opened (see store.SessionCounts; PerMinute gives their rate).
type SessionsOpened = store.SessionCounts

// TurnHeldAfter is how long a drain's turn may be held before Status
// reports its holder: a gathering takes Config.Gather, a claim's
// statements milliseconds, a protocol-3 claim's batch (it holds the turn
// while it is published) well under a second.
const TurnHeldAfter = 5 * time.Second

// TurnHold is a session that has held a drain's turn or next turn for
// TurnHeldAfter or longer (HeldSeconds, at least).
type TurnHold struct {
	PID         int32  `json:"pid"`
	Application string `json:"application"`
	Role        string `json:"role"` // turn, or next
	// State is the session's (idle: a batch out, a gathering; active),
	// when the job's role may see it (pg_read_all_stats).
	State       string  `json:"state,omitempty"`
	HeldSeconds float64 `json:"held_seconds"`
	// Waiting counts the drains that wait for it.
	Waiting int `json:"waiting"`
}

// EntityProgress is how far an operation went in one entity's events.
type EntityProgress struct {
	// Entity is the entity's name (its view's), or its history table when
	// the generation no longer names it.
	Entity string `json:"entity"`
	// Done counts the events the operation passed, Total those in its
	// scope.
	Done  int64 `json:"done"`
	Total int64 `json:"total"`
}

// operationProgress reads a running replay's and backfill's progress by
// entity.
func operationProgress(ctx context.Context, st *store.Store, t store.Target) (replay, backfill []EntityProgress, err error) {
	names := entityNamesOf(t)
	named := func(progress []store.EntityProgress) []EntityProgress {
		var out []EntityProgress
		for _, p := range progress {
			name := cmp.Or(names[p.EntityID], p.HistoryTable)
			if p.EntityID == "" && p.HistoryTable == "" {
				name = "baselines"
			}
			out = append(out, EntityProgress{Entity: name, Done: p.Done, Total: p.Total})
		}
		return out
	}
	r, err := st.ReplayProgress(ctx, t)
	if err != nil {
		return nil, nil, err
	}
	b, err := st.BackfillProgress(ctx, t)
	return named(r), named(b), err
}

// entityNamesOf returns a target's entity names (its views') by entity id.
func entityNamesOf(t store.Target) map[string]string {
	names := map[string]string{}
	if specs, err := warehouse.ViewSpecs(ViewsTarget(t)); err == nil {
		for _, spec := range specs {
			if spec.Kind == "entity" {
				names[spec.EntityID] = spec.Name
			}
		}
	}
	return names
}

// entityNames returns the active target's entity names by id, for an
// operator's output that has only the ids (a dead letter's event): one
// attempt of at most 5 s, and none when they cannot be read now.
func (s *Service) entityNames(ctx context.Context, workspaceID string) map[string]string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	names := map[string]string{}
	_ = s.onActiveTarget(ctx, workspaceID, func(_ registry.Workspace, _ *store.Store, t store.Target) error {
		names = entityNamesOf(t)
		return nil
	})
	return names
}

// LifecycleHold is an exclusive hold of the SDK's lifecycle lock: any
// role that can connect may take it (advisory locks need no privilege),
// and while it lasts every SDK write waits.
type LifecycleHold struct {
	// Holders are the backends holding it, by pid and application_name.
	Holders []LifecycleHolder `json:"holders"`
	// Waiting counts the sessions waiting for it; LongestWaitSeconds is
	// how long the first of them has waited.
	Waiting            int     `json:"waiting"`
	LongestWaitSeconds float64 `json:"longest_wait_seconds"`
}

// LifecycleHolder is one backend holding the lifecycle lock exclusively.
type LifecycleHolder struct {
	PID         int32  `json:"pid"`
	Application string `json:"application"`
}

// SetAsideReport is a target's set-aside events.
type SetAsideReport struct {
	// Count is how many events are set aside.
	Count int64 `json:"count"`
	// Events lists the oldest of them (up to the limit asked for).
	Events []SetAsideEvent `json:"events,omitempty"`
	// Oldest is when the longest set-aside event was first set aside, at
	// the latest (store.Figures.SetAsideSince), and OldestAgeSeconds its
	// age: the set-aside lag the alert reads. Absent when none is, and at
	// protocol 3.
	Oldest           *time.Time `json:"oldest,omitempty"`
	OldestAgeSeconds *float64   `json:"oldest_age_seconds,omitempty"`
	// NotShared: at protocol 3 the set-aside events are kept in the
	// memory of the process that set them aside, so other processes (this
	// report's) see none; Note says so.
	NotShared bool   `json:"not_shared,omitempty"`
	Note      string `json:"note,omitempty"`
}

// NoteSetAsideNotShared is SetAsideReport.Note at protocol 3.
const NoteSetAsideNotShared = "protocol 3 keeps set-aside events in the memory of the drain or job process that set them aside: " +
	"other processes, and this report, see none (each drain's error log names the events it sets aside); protocol 4 keeps them in the database"

// SetAsideEvent is one set-aside event with the reason found now.
type SetAsideEvent struct {
	HistoryID    string `json:"history_id"`
	EventID      string `json:"event_id"`
	HistoryTable string `json:"history_table,omitempty"`
	// Reason is why it cannot be published (missing_history,
	// not_captured, unknown_table, malformed, too_large, rejected,
	// publish_failed); Detail says more.
	Reason string `json:"reason"`
	Detail string `json:"detail,omitempty"`
	// Since is when it was last set aside, NextAttempt when claims take it
	// again, Attempts how many times in a row it was set aside.
	Since       time.Time `json:"since"`
	NextAttempt time.Time `json:"next_attempt"`
	Attempts    int       `json:"attempts"`
}

func setAsideReport(r store.SetAsideReport) SetAsideReport {
	out := SetAsideReport{Count: r.Count, NotShared: r.InThisProcessOnly}
	if r.InThisProcessOnly {
		out.Note = NoteSetAsideNotShared
	}
	for _, e := range r.Events {
		detail := e.Detail
		if e.Reason == store.ReasonPublishFailed {
			detail = fmt.Sprintf("every publish of it alone failed with %s while Pub/Sub took other events (the drain's error log has the error)", codes.Code(e.Code))
		}
		out.Events = append(out.Events, SetAsideEvent{HistoryID: e.HistoryID, EventID: e.EventID, HistoryTable: e.HistoryTable,
			Reason: string(e.Reason), Detail: detail, Since: e.Since, NextAttempt: e.NextAttempt, Attempts: e.Attempts})
	}
	return out
}

// Status reads a workspace's status: of generation, or of the active target
// when generation is empty. It lists up to setAsideLimit set-aside events.
// On an error it returns what it had read (the protocol, at least).
func (s *Service) Status(ctx context.Context, workspaceID, generation string, setAsideLimit int) (WorkspaceStatus, error) {
	var out WorkspaceStatus
	err := s.retrying(ctx, "status", workspaceID, func() (err error) {
		out, err = s.status(ctx, workspaceID, generation, setAsideLimit)
		return err
	})
	return out, err
}

// status is one attempt of Status.
func (s *Service) status(ctx context.Context, workspaceID, generation string, setAsideLimit int) (WorkspaceStatus, error) {
	var out WorkspaceStatus
	ws, err := s.Workspace(workspaceID)
	if err != nil {
		return out, err
	}
	l, err := s.lease(ctx, ws)
	if err != nil {
		return out, err
	}
	defer l.Release()
	st := l.store
	state, t, err := st.ActiveTarget(ctx)
	out.Protocol, out.Enabled = state.Version, state.Enabled
	if generation != "" && (err == nil || errors.Is(err, store.ErrNoActiveTarget)) {
		t, err = st.Target(ctx, generation)
	}
	if err != nil {
		return out, err
	}
	out.Generation = t.Generation
	hold, err := st.LifecycleHold(ctx)
	if err != nil {
		return out, err
	}
	if hold != nil {
		out.LifecycleHeld = &LifecycleHold{Waiting: hold.Waiting, LongestWaitSeconds: hold.LongestWait.Seconds()}
		for _, h := range hold.Holders {
			out.LifecycleHeld.Holders = append(out.LifecycleHeld.Holders, LifecycleHolder{PID: h.PID, Application: h.Application})
		}
	}
	holders, err := st.TurnHolders(ctx)
	if err != nil {
		return out, err
	}
	if out.Sessions, err = st.SessionCounts(ctx); err != nil {
		return out, err
	}
	for _, h := range holders {
		if h.Held >= TurnHeldAfter {
			out.TurnsHeld = append(out.TurnsHeld, TurnHold{PID: h.PID, Application: h.Application, Role: h.Role, State: h.State,
				HeldSeconds: h.Held.Seconds(), Waiting: h.Waiting})
		}
	}
	out.BaselineComplete, out.BackfillComplete, out.ReplayComplete = t.BaselineComplete, t.BackfillComplete, t.ReplayComplete
	out.BaselineCursor, out.BackfillCursor, out.ReplayCursor = t.BaselineCursor, t.BackfillCursor, t.ReplayCursor
	counts, err := st.Status(ctx, t)
	if err != nil {
		return out, err
	}
	if out.ReplayProgress, out.BackfillProgress, err = operationProgress(ctx, st, t); err != nil {
		return out, err
	}
	out.Total, out.Accepted, out.Verified, out.InitiallyReady = counts.Total, counts.Accepted, counts.Verified, counts.InitiallyReady
	out.Pending, out.DueVerifications, out.OldestPending = counts.Pending, counts.DueVerifications, counts.OldestPending
	var setAsideSince time.Time
	switch f, err := st.Figures(ctx, t); {
	case err == nil:
		out.Pending, out.Unverified, out.DueVerifications, out.FiguresCapped = f.Pending, f.Unverified, f.DueVerifications, f.Capped
		out.OldestPending, out.OldestUnverified = f.OldestPending, f.OldestUnverified
		setAsideSince = f.SetAsideSince
	case errors.Is(err, store.ErrNoFigures):
		out.Unverified = counts.Accepted - counts.Verified
	default:
		return out, err
	}
	rep, err := st.ReadSetAside(ctx, t, setAsideLimit, publish.MaxMessageBytes)
	out.SetAside = setAsideReport(rep)
	if !setAsideSince.IsZero() {
		since := setAsideSince.UTC()
		age := max(time.Since(since), 0).Seconds()
		out.SetAside.Oldest, out.SetAside.OldestAgeSeconds = &since, &age
	}
	return out, err
}

// SetAsideResult is a workspace's set-aside events, and how many a retry
// made claimable again.
type SetAsideResult struct {
	Generation string         `json:"generation"`
	SetAside   SetAsideReport `json:"set_aside"`
	Retried    int64          `json:"retried,omitempty"`
}

// SetAsideEvents lists up to limit of the active target's set-aside events and,
// with retry, ends their backoff so that the next drain tries them.
func (s *Service) SetAsideEvents(ctx context.Context, workspaceID string, limit int, retry bool) (SetAsideResult, error) {
	var res SetAsideResult
	err := s.retrying(ctx, "set-aside", workspaceID, func() error {
		return s.onActiveTarget(ctx, workspaceID, func(_ registry.Workspace, st *store.Store, t store.Target) error {
			res.Generation = t.Generation
			rep, err := st.ReadSetAside(ctx, t, limit, publish.MaxMessageBytes)
			if err != nil {
				return err
			}
			res.SetAside = setAsideReport(rep)
			if retry {
				res.Retried, err = st.RetrySetAside(ctx, t)
			}
			return err
		})
	})
	return res, err
}

// ViewCreator creates a target's latest-state views in a workspace's
// warehouse. *warehouse.BigQuery is the implementation.
type ViewCreator interface {
	CreateViews(ctx context.Context, ws registry.Workspace, t warehouse.ViewTarget) ([]string, error)
}

// CreateViews creates or replaces the BigQuery latest-state views of the
// workspace's active target and returns their names.
func (s *Service) CreateViews(ctx context.Context, workspaceID string) ([]string, error) {
	if s.cfg.Views == nil {
		return nil, errors.New("delivery: no warehouse configured for views")
	}
	var names []string
	err := s.retrying(ctx, "views", workspaceID, func() error {
		return s.onActiveTarget(ctx, workspaceID, func(ws registry.Workspace, _ *store.Store, t store.Target) (err error) {
			names, err = s.cfg.Views.CreateViews(ctx, ws, ViewsTarget(t))
			return err
		})
	})
	return names, err
}

// ViewsTarget is the warehouse's view of a replication target.
func ViewsTarget(t store.Target) warehouse.ViewTarget {
	sel := make([]warehouse.Selection, len(t.Selection))
	for i, s := range t.Selection {
		sel[i] = warehouse.Selection{EntityID: s.EntityID, Fields: s.Fields, Relationships: s.Relationships}
	}
	return warehouse.ViewTarget{Generation: t.Generation, SourceID: t.SourceID, Manifest: t.Manifest, Selection: sel}
}

// ActiveViewsTarget is what the views of the workspace's active target are
// built from (warehouse.ViewSpecs).
func (s *Service) ActiveViewsTarget(ctx context.Context, workspaceID string) (warehouse.ViewTarget, error) {
	var out warehouse.ViewTarget
	err := s.retrying(ctx, "views", workspaceID, func() error {
		return s.onActiveTarget(ctx, workspaceID, func(_ registry.Workspace, _ *store.Store, t store.Target) error {
			out = ViewsTarget(t)
			return nil
		})
	})
	return out, err
}

// onActiveTarget runs fn with the workspace, its store and its active
// target.
func (s *Service) onActiveTarget(ctx context.Context, workspaceID string, fn func(registry.Workspace, *store.Store, store.Target) error) error {
	ws, err := s.Workspace(workspaceID)
	if err != nil {
		return err
	}
	l, err := s.lease(ctx, ws)
	if err != nil {
		return err
	}
	defer l.Release()
	_, t, err := l.store.ActiveTarget(ctx)
	if err != nil {
		return err
	}
	return fn(ws, l.store, t)
}
