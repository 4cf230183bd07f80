package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/registry"
)

// workspaceStatus is one workspace's line of `job status`.
type workspaceStatus struct {
	Workspace        string  `json:"workspace"`
	Protocol         int     `json:"protocol"`
	Generation       string  `json:"generation,omitempty"`
	Enabled          bool    `json:"enabled"`
	BaselineComplete bool    `json:"baseline_complete"`
	BaselineCursor   any     `json:"baseline_cursor,omitempty"`
	BackfillComplete bool    `json:"backfill_complete"`
	BackfillCursor   any     `json:"backfill_cursor,omitempty"`
	ReplayComplete   bool    `json:"replay_complete"`
	ReplayCursor     *string `json:"replay_cursor,omitempty"`
	// ReplayProgress is, while a replay runs, how far its pages went in
	// each entity's events.
	ReplayProgress []delivery.EntityProgress `json:"replay_progress,omitempty"`
	// BackfillProgress is, while a backfill runs, how many of each
	// entity's events (and of the baselines) it has enqueued.
	BackfillProgress []delivery.EntityProgress `json:"backfill_progress,omitempty"`
	Total            int64                     `json:"total"`
	Accepted         int64                     `json:"accepted"`
	Verified         int64                     `json:"verified"`
	InitiallyReady   bool                      `json:"initially_ready"`
	// Pending counts the events waiting to be published (set-aside ones
	// apart, in SetAside); OldestPending is when the oldest of them was
	// queued or sent back, and its age the delivery lag.
	Pending                 int64      `json:"pending"`
	OldestPending           *time.Time `json:"oldest_pending,omitempty"`
	OldestPendingAgeSeconds *float64   `json:"oldest_pending_age_seconds,omitempty"`
	// Unverified counts the accepted events not verified yet;
	// OldestUnverified is when the oldest was accepted, and its age the
	// verification lag. DueVerifications are those whose check is due.
	Unverified                 int64      `json:"unverified"`
	OldestUnverified           *time.Time `json:"oldest_unverified,omitempty"`
	OldestUnverifiedAgeSeconds *float64   `json:"oldest_unverified_age_seconds,omitempty"`
	DueVerifications           int64      `json:"due_verifications"`
	// FiguresCapped: the backlog is larger than the bounded reads count
	// (see delivery.WorkspaceStatus).
	FiguresCapped bool `json:"figures_capped,omitempty"`
	// SetAside lists the events set aside because they cannot be
	// published (with their reasons), seen from any process.
	SetAside delivery.SetAsideReport `json:"set_aside"`
	// DeadLetters counts the messages in the workspace's dead-letter
	// subscription (up to deadLetterPeek; Capped: at least that many) and
	// the oldest one's age; DeadLetterError says why they could not be
	// counted.
	delivery.DeadLetterBacklog
	DeadLetterError string `json:"dead_letter_error,omitempty"`
	// LifecycleHeld is a session holding the SDK's lifecycle lock
	// exclusively, which every SDK write waits for.
	LifecycleHeld *delivery.LifecycleHold `json:"lifecycle_held,omitempty"`
	// TurnsHeld are the sessions that have held the workspace's drain turn
	// or next turn for 5 s or more: its wake-ups wait behind them.
	TurnsHeld []delivery.TurnHold `json:"turns_held,omitempty"`
	// SessionsOpened is the connection churn the workspace's server sees:
	// sessions it opened a minute (absent when it cannot tell).
	SessionsOpened *sessionsOpened `json:"sessions_opened,omitempty"`
	Error          string          `json:"error,omitempty"`
	sessions       delivery.SessionsOpened
}

// sessionsOpened is a server's sessions opened a minute, in the
// workspace's database and in all of the server's, over the last
// OverSeconds: since the last refresh with --watch, else since the
// server's statistics were reset.
type sessionsOpened struct {
	DatabasePerMinute float64 `json:"database_per_minute"`
	ServerPerMinute   float64 `json:"server_per_minute"`
	OverSeconds       float64 `json:"over_seconds"`
}

// churn sets s's SessionsOpened from its counts and the previous read of
// the same workspace (the zero value: none).
func (s *workspaceStatus) churn(prev delivery.SessionsOpened) {
	db, srv, ok := s.sessions.PerMinute(prev)
	if !ok {
		return
	}
	from := prev.ReadAt
	if from.IsZero() {
		from = s.sessions.Since
	}
	s.SessionsOpened = &sessionsOpened{DatabasePerMinute: db, ServerPerMinute: srv, OverSeconds: s.sessions.ReadAt.Sub(from).Seconds()}
}

// deadLetterPeek is how many dead-lettered messages `job status` counts at
// most per workspace, and deadLetterPeekTime how long it reads them.
const (
	deadLetterPeek     = 1000
	deadLetterPeekTime = 5 * time.Second
)

func rawCursor(raw []byte) any {
	if len(raw) == 0 || string(raw) == "{}" {
		return nil
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return string(raw)
	}
	return v
}

// status reads one workspace's status.
func (e *env) status(ctx context.Context, ws registry.Workspace) (workspaceStatus, error) {
	st, err := e.svc.Status(ctx, ws.ID, e.generation, 100)
	out := workspaceStatus{Workspace: ws.ID, Protocol: st.Protocol, Enabled: st.Enabled}
	if err != nil && st.Generation == "" {
		return out, err
	}
	out.Generation = st.Generation
	out.BaselineComplete, out.BackfillComplete, out.ReplayComplete = st.BaselineComplete, st.BackfillComplete, st.ReplayComplete
	out.BaselineCursor, out.BackfillCursor, out.ReplayCursor = rawCursor(st.BaselineCursor), rawCursor(st.BackfillCursor), st.ReplayCursor
	out.ReplayProgress, out.BackfillProgress = st.ReplayProgress, st.BackfillProgress
	out.Total, out.Accepted, out.Verified, out.InitiallyReady = st.Total, st.Accepted, st.Verified, st.InitiallyReady
	out.Pending, out.Unverified, out.DueVerifications, out.FiguresCapped = st.Pending, st.Unverified, st.DueVerifications, st.FiguresCapped
	now := time.Now()
	if !st.OldestPending.IsZero() {
		oldest := st.OldestPending.UTC()
		out.OldestPending = &oldest
		age := max(now.Sub(oldest), 0).Seconds()
		out.OldestPendingAgeSeconds = &age
	}
	if !st.OldestUnverified.IsZero() {
		oldest := st.OldestUnverified.UTC()
		out.OldestUnverified = &oldest
		age := max(now.Sub(oldest), 0).Seconds()
		out.OldestUnverifiedAgeSeconds = &age
	}
	out.SetAside = st.SetAside
	out.LifecycleHeld = st.LifecycleHeld
	out.TurnsHeld = st.TurnsHeld
	out.sessions = st.Sessions
	backlog, dlErr := e.svc.DeadLetterBacklog(ctx, ws.ID, deadLetterPeek, deadLetterPeekTime)
	out.DeadLetterBacklog = backlog
	if dlErr != nil {
		out.DeadLetterError = oneLine(dlErr.Error())
	}
	return out, err
}

func runStatus(e *env) error {
	prev := map[string]delivery.SessionsOpened{}
	for {
		results := e.svc.ForEach(e.ctx, e.workspaces, e.parallel, func(ctx context.Context, ws registry.Workspace) (any, error) {
			return e.status(ctx, ws)
		})
		all := make([]workspaceStatus, len(results))
		lines := make([]workspaceLine, len(results))
		for i, r := range results {
			all[i], _ = r.Detail.(workspaceStatus)
			all[i].Workspace = r.Workspace
			all[i].churn(prev[r.Workspace])
			prev[r.Workspace] = all[i].sessions
			lines[i] = workspaceLine{Workspace: r.Workspace, OK: r.Err == nil}
			if r.Err != nil {
				all[i].Error = oneLine(r.Err.Error())
				lines[i].Error = all[i].Error
			}
		}
		if err := e.writeStatus(all); err != nil {
			return err
		}
		if e.watch == 0 {
			return failure("status", lines, false, "", e.causesShown())
		}
		select {
		case <-e.ctx.Done():
			return nil
		case <-time.After(e.watch):
		}
	}
}

// writeStatus writes the table, or one JSON document with --json; with
// --watch, the table refreshes in place on a terminal, and elsewhere each
// interval is one JSON line (for a log or a pipe).
func (e *env) writeStatus(all []workspaceStatus) error {
	terminal := isTerminal(e.stdout)
	if e.json || e.watch != 0 && !terminal {
		return e.writeJSON(all)
	}
	if e.watch != 0 {
		fmt.Fprint(e.stdout, "\033[H\033[2J") // refresh in place
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKSPACE\tPROTOCOL\tGENERATION\tENABLED\tBASELINE\tBACKFILL\tREPLAY\tTOTAL\tACCEPTED\tVERIFIED\tREADY\tPENDING\tDELIVERY LAG\tUNVERIFIED\tVERIFICATION LAG\tDUE\tSET ASIDE\tDEAD LETTERS\tOLDEST DEAD LETTER\tSESSIONS/MIN DB/SERVER")
	for _, s := range all {
		if s.Error != "" {
			protocol := "-" // not read
			if s.Protocol != 0 {
				protocol = fmt.Sprint(s.Protocol)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\terror: %s\n", s.Workspace, protocol, cmp.Or(s.Generation, "-"), s.Error)
			continue
		}
		setAside := fmt.Sprint(s.SetAside.Count)
		if s.SetAside.OldestAgeSeconds != nil {
			setAside += " (" + age(s.SetAside.OldestAgeSeconds) + ")"
		}
		if s.SetAside.NotShared {
			setAside = "n/a (protocol 3)"
		}
		dead := atLeast(int64(s.Messages), s.Capped)
		if s.DeadLetterError != "" {
			dead = "unknown"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", s.Workspace, s.Protocol, s.Generation,
			yes(s.Enabled), done(s.BaselineComplete, s.BaselineCursor), done(s.BackfillComplete, s.BackfillCursor),
			done(s.ReplayComplete, s.ReplayCursor), s.Total, s.Accepted, s.Verified, yes(s.InitiallyReady), atLeast(s.Pending, s.FiguresCapped),
			age(s.OldestPendingAgeSeconds), atLeast(s.Unverified, s.FiguresCapped), age(s.OldestUnverifiedAgeSeconds), s.DueVerifications, setAside,
			dead, age(nonZero(s.OldestAgeSeconds)), s.SessionsOpened)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range all {
		if s.SetAside.NotShared {
			fmt.Fprintf(e.stdout, "\n%s: set aside: %s\n", s.Workspace, s.SetAside.Note)
			break
		}
	}
	for _, s := range all {
		if h := s.LifecycleHeld; h != nil {
			holders := make([]string, len(h.Holders))
			for i, b := range h.Holders {
				holders[i] = fmt.Sprintf("pid %d (%s)", b.PID, cmp.Or(b.Application, "no application_name"))
			}
			fmt.Fprintf(e.stdout, "\n%s: the SDK's lifecycle lock is held exclusively by %s; %d sessions wait for it, the first for %s (SDK writes wait behind it; pg_terminate_backend ends a stray holder)\n",
				s.Workspace, strings.Join(holders, ", "), h.Waiting, time.Duration(h.LongestWaitSeconds*float64(time.Second)).Round(time.Millisecond))
		}
	}
	for _, s := range all {
		for _, h := range s.TurnsHeld {
			role := map[string]string{"turn": "turn", "next": "next turn"}[h.Role]
			fmt.Fprintf(e.stdout, "\n%s: the drain's %s has been held for at least %s by pid %d (%s); %d drains wait for it (the server ends a frozen holder after 15 s idle; pg_terminate_backend ends it sooner)\n",
				s.Workspace, role, time.Duration(h.HeldSeconds*float64(time.Second)).Round(time.Millisecond),
				h.PID, cmp.Or(h.Application, "no application_name"), h.Waiting)
		}
	}
	for _, s := range all {
		if len(s.ReplayProgress) > 0 {
			fmt.Fprintf(e.stdout, "\n%s: replay in progress: %s\n", s.Workspace, progressLine(s.ReplayProgress, "sent back"))
		}
		if len(s.BackfillProgress) > 0 {
			fmt.Fprintf(e.stdout, "\n%s: backfill in progress: %s\n", s.Workspace, progressLine(s.BackfillProgress, "enqueued"))
		}
	}
	for _, s := range all {
		if s.DeadLetterError != "" {
			fmt.Fprintf(e.stdout, "\n%s: dead letters not counted: %s\n", s.Workspace, s.DeadLetterError)
		}
	}
	for _, s := range all {
		if len(s.SetAside.Events) == 0 {
			continue
		}
		fmt.Fprintf(e.stdout, "\nset aside in %s (%d):\n", s.Workspace, s.SetAside.Count)
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "HISTORY ID\tEVENT ID\tTABLE\tREASON\tSINCE\tNEXT ATTEMPT\tATTEMPTS")
		for _, ev := range s.SetAside.Events {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\n", ev.HistoryID, ev.EventID, cmp.Or(ev.HistoryTable, "(baseline)"), ev.Reason,
				ev.Since.UTC().Format(time.RFC3339), ev.NextAttempt.UTC().Format(time.RFC3339), ev.Attempts)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// age writes an age in seconds as a duration ("-" for none).
func age(seconds *float64) string {
	if seconds == nil {
		return "-"
	}
	return time.Duration(*seconds * float64(time.Second)).Round(time.Second).String()
}

func nonZero(f float64) *float64 {
	if f == 0 {
		return nil
	}
	return &f
}

// atLeast writes a count, marked when the bounded read capped it.
func atLeast(n int64, capped bool) string {
	if capped {
		return fmt.Sprintf("≥%d", n)
	}
	return fmt.Sprint(n)
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func done(complete bool, cursor any) string {
	if complete {
		return "complete"
	}
	if c, ok := cursor.(*string); ok && c != nil {
		return "at " + (*c)[:8] + "…"
	}
	if cursor != nil {
		raw, _ := json.Marshal(cursor)
		if s := string(raw); s != "null" {
			return "at " + s
		}
	}
	return "pending"
}

// progressLine says how far a replay's or a backfill's pages went: in
// all, then by entity.
func progressLine(progress []delivery.EntityProgress, did string) string {
	var done, total int64
	parts := make([]string, len(progress))
	for i, p := range progress {
		done, total = done+p.Done, total+p.Total
		parts[i] = fmt.Sprintf("%s %d of %d", p.Entity, p.Done, p.Total)
	}
	return fmt.Sprintf("%d of %d events %s (%d%%): %s", done, total, did, done*100/max(total, 1), strings.Join(parts, ", "))
}

// String writes the churn as "database/server" sessions a minute ("-":
// unknown).
func (s *sessionsOpened) String() string {
	if s == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f/%.1f", s.DatabasePerMinute, s.ServerPerMinute)
}
