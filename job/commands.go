package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/segmentstream/ontology-replication/shared/publish"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/store"
)

// target returns the workspace's store and the target a command works on:
// --generation's, or the active one.
func (e *env) target(ws registry.Workspace) (*store.Store, store.State, store.Target, error) {
	st, err := e.svc.Store(e.ctx, ws)
	if err != nil {
		return nil, store.State{}, store.Target{}, err
	}
	state, active, err := st.ActiveTarget(e.ctx)
	if e.generation == "" {
		if errors.Is(err, store.ErrNoActiveTarget) {
			return st, state, active, fmt.Errorf("workspace %s: %w: start replication in the SDK first", ws.ID, err)
		}
		return st, state, active, err
	}
	if err != nil && !errors.Is(err, store.ErrNoActiveTarget) {
		return st, state, active, err
	}
	t, err := st.Target(e.ctx, e.generation)
	if err != nil {
		return st, state, t, fmt.Errorf("workspace %s: %w", ws.ID, err)
	}
	return st, state, t, nil
}

// eachWorkspace runs fn for every workspace of the task, stopping at the
// first error.
func (e *env) eachWorkspace(fn func(ws registry.Workspace) error) error {
	for _, ws := range e.workspaces {
		if err := fn(ws); err != nil {
			return err
		}
	}
	return nil
}

func runDrain(e *env) error {
	return e.eachWorkspace(func(ws registry.Workspace) error {
		return e.drainWhile(ws, nil)
	})
}

func runBackfill(e *env) error {
	return e.eachWorkspace(func(ws registry.Workspace) error {
		st, _, t, err := e.target(ws)
		if err != nil {
			return err
		}
		if !t.UsesDelivery() {
			return fmt.Errorf("workspace %s: backfill needs protocol 4; the database is at %d (upgrade the SDK and run its migration)", ws.ID, t.DeliveryVersion)
		}
		if !t.BaselineComplete {
			return fmt.Errorf("workspace %s: generation %s: %w; run backfill after the SDK has finished it", ws.ID, t.Generation, store.ErrBaselineIncomplete)
		}
		total, err := st.BackfillTotal(e.ctx, t)
		if err != nil {
			return err
		}
		pages := func() error {
			return e.pages("backfill", ws, total, t.BackfillComplete, func(ctx context.Context) (int, bool, error) {
				page, err := st.AdvanceBackfill(ctx, t)
				return page.Rows, page.Complete, err
			})
		}
		if t.Generation != e.activeGeneration(st) {
			return pages() // only the active generation is drained
		}
		// Events without a receipt are queued pending: drained as the pages go.
		return e.drainWhile(ws, pages)
	})
}

// pages runs page until it reports completion, each page its own
// transaction under its own deadline, showing progress; an interrupt stops
// it between pages.
func (e *env) pages(operation string, ws registry.Workspace, total int64, complete bool, page func(ctx context.Context) (rows int, complete bool, err error)) error {
	p := e.progress.start(operation, ws.ID, "rows", total)
	defer p.done()
	for !complete {
		if e.ctx.Err() != nil {
			return interrupted(operation, ws.ID, p.pages)
		}
		ctx, cancel := e.page()
		rows, done, err := page(ctx)
		cancel()
		if err != nil {
			return fmt.Errorf("workspace %s: %w", ws.ID, err)
		}
		p.add(rows)
		complete = done
	}
	return nil
}

func (e *env) activeGeneration(st *store.Store) string {
	state, err := st.State(e.ctx)
	if err != nil {
		return ""
	}
	return state.ActiveGeneration
}

func runReplay(e *env) error {
	return e.eachWorkspace(func(ws registry.Workspace) error {
		st, _, t, err := e.target(ws)
		if err != nil {
			return err
		}
		if !t.BaselineComplete {
			return fmt.Errorf("workspace %s: generation %s: %w; replay after the SDK has finished it", ws.ID, t.Generation, store.ErrBaselineIncomplete)
		}
		if !t.BackfillComplete {
			return fmt.Errorf("workspace %s: generation %s has not been backfilled into the delivery queue: run `job backfill --workspace %s` first", ws.ID, t.Generation, ws.ID)
		}
		if t.UsesDelivery() && !t.ReplayComplete {
			e.log.Info("resuming the replay in progress", "workspace", ws.ID, "generation", t.Generation)
		} else {
			ctx, cancel := e.page()
			err := st.InitReplay(ctx, t)
			cancel()
			if err != nil {
				return fmt.Errorf("workspace %s: %w", ws.ID, err)
			}
			if t, err = st.Target(e.ctx, t.Generation); err != nil {
				return err
			}
		}
		total, err := st.ReplayRemaining(e.ctx, t)
		if err != nil {
			return err
		}
		pages := func() error {
			return e.pages("replay", ws, total, false, func(ctx context.Context) (int, bool, error) {
				page, err := st.AdvanceReplay(ctx, t)
				return page.Rows, page.Complete, err
			})
		}
		if t.Generation != e.activeGeneration(st) {
			return pages() // only the active generation is drained
		}
		return e.drainWhile(ws, pages)
	})
}

func runVerify(e *env) error {
	var names []string
	for _, ws := range e.workspaces {
		names = append(names, ws.ID)
	}
	if len(names) == 0 {
		return nil
	}
	results := e.svc.VerifyAll(e.ctx, names, e.budget, 20)
	var failed []string
	for _, r := range results {
		e.log.Info("verify", "workspace", r.Workspace, "generation", r.Generation, "rounds", r.Rounds, "checked", r.Checked,
			"verified", r.Verified, "retried", r.Retried, "requeued", r.Requeued, "swept", r.Swept, "error", r.Error)
		if r.Error != "" {
			failed = append(failed, r.Workspace+": "+r.Error)
		}
	}
	if e.json {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(results); err != nil {
			return err
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("verification failed for %s", strings.Join(failed, "; "))
	}
	return nil
}

// workspaceStatus is one workspace's line of `job status`.
type workspaceStatus struct {
	Workspace        string     `json:"workspace"`
	Protocol         int        `json:"protocol"`
	Generation       string     `json:"generation,omitempty"`
	Enabled          bool       `json:"enabled"`
	BaselineComplete bool       `json:"baseline_complete"`
	BaselineCursor   any        `json:"baseline_cursor,omitempty"`
	BackfillComplete bool       `json:"backfill_complete"`
	BackfillCursor   any        `json:"backfill_cursor,omitempty"`
	ReplayComplete   bool       `json:"replay_complete"`
	ReplayCursor     *string    `json:"replay_cursor,omitempty"`
	Total            int64      `json:"total"`
	Accepted         int64      `json:"accepted"`
	Verified         int64      `json:"verified"`
	InitiallyReady   bool       `json:"initially_ready"`
	Pending          int64      `json:"pending"`
	OldestPending    *time.Time `json:"oldest_pending,omitempty"`
	OldestPendingAge string     `json:"oldest_pending_age,omitempty"`
	DueVerifications int64      `json:"due_verifications"`
	// SetAside lists the events set aside because they cannot be
	// published (with their reasons), seen from any process.
	SetAside store.SetAsideReport `json:"set_aside"`
	Error    string               `json:"error,omitempty"`
}

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

func (e *env) status(ws registry.Workspace) workspaceStatus {
	out := workspaceStatus{Workspace: ws.ID}
	st, state, t, err := e.target(ws)
	out.Protocol, out.Enabled = state.Version, state.Enabled
	if err != nil {
		out.Error = err.Error()
		return out
	}
	out.Generation = t.Generation
	out.BaselineComplete, out.BackfillComplete, out.ReplayComplete = t.BaselineComplete, t.BackfillComplete, t.ReplayComplete
	out.BaselineCursor, out.BackfillCursor, out.ReplayCursor = rawCursor(t.BaselineCursor), rawCursor(t.BackfillCursor), t.ReplayCursor
	s, err := st.Status(e.ctx, t)
	if err != nil {
		out.Error = err.Error()
		return out
	}
	out.Total, out.Accepted, out.Verified, out.InitiallyReady = s.Total, s.Accepted, s.Verified, s.InitiallyReady
	out.Pending, out.DueVerifications = s.Pending, s.DueVerifications
	if !s.OldestPending.IsZero() {
		oldest := s.OldestPending.UTC()
		out.OldestPending = &oldest
		out.OldestPendingAge = max(time.Since(oldest), 0).Round(time.Second).String()
	}
	if out.SetAside, err = st.SetAside(e.ctx, t, 100, publish.MaxMessageBytes); err != nil {
		out.Error = err.Error()
	}
	return out
}

func runStatus(e *env) error {
	var all []workspaceStatus
	failed := 0
	for _, ws := range e.workspaces {
		s := e.status(ws)
		if s.Error != "" {
			failed++
		}
		all = append(all, s)
	}
	if e.json {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(all); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "WORKSPACE\tPROTOCOL\tGENERATION\tENABLED\tBASELINE\tBACKFILL\tREPLAY\tTOTAL\tACCEPTED\tVERIFIED\tREADY\tPENDING\tOLDEST PENDING\tDUE\tSET ASIDE")
		for _, s := range all {
			if s.Error != "" {
				fmt.Fprintf(tw, "%s\t%d\t%s\terror: %s\n", s.Workspace, s.Protocol, s.Generation, s.Error)
				continue
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%d\t%s\t%d\t%d\n", s.Workspace, s.Protocol, s.Generation,
				yes(s.Enabled), done(s.BaselineComplete, s.BaselineCursor), done(s.BackfillComplete, s.BackfillCursor),
				done(s.ReplayComplete, s.ReplayCursor), s.Total, s.Accepted, s.Verified, yes(s.InitiallyReady), s.Pending,
				cmpOr(s.OldestPendingAge, "-"), s.DueVerifications, s.SetAside.Count)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if failed > 0 {
		var names []string
		for _, s := range all {
			if s.Error != "" {
				names = append(names, s.Workspace)
			}
		}
		slices.Sort(names)
		return fmt.Errorf("status failed for %s", strings.Join(names, ", "))
	}
	return nil
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

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func runViews(e *env) error {
	return e.eachWorkspace(func(ws registry.Workspace) error {
		_, _, t, err := e.target(ws)
		if err != nil {
			return err
		}
		names, err := e.svc.Warehouse.CreateViews(e.ctx, ws, t)
		if err != nil {
			return fmt.Errorf("workspace %s: %w", ws.ID, err)
		}
		for _, n := range names {
			fmt.Fprintf(e.stdout, "%s\t%s\n", ws.ID, n)
		}
		return nil
	})
}
