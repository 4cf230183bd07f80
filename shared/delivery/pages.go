package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentstream/ontology-replication/shared/store"
)

// PagesOptions configures Backfill and Replay.
type PagesOptions struct {
	// Generation is the generation to work on; empty for the active one.
	Generation string
	// Drains is how many drains publish alongside the pages (only the
	// active generation is drained). Default: 1.
	Drains int
	// PageTimeout bounds each page (and each batch). Default: 2m.
	PageTimeout time.Duration
	// Progress shows the pages' progress, then the drain's.
	Progress Progress
	// Restart starts a new replay even when the last one's pages are done
	// but its events are not all published yet (Replay only; without it,
	// that replay is resumed: its events are drained).
	Restart bool
}

// PagesResult is what Backfill or Replay did.
type PagesResult struct {
	Generation string `json:"generation"`
	// Pages and Rows count the pages advanced and the rows they enqueued or
	// reset.
	Pages int `json:"pages"`
	Rows  int `json:"rows"`
	// Resumed reports that work in progress was continued.
	Resumed bool `json:"resumed,omitempty"`
	// Selection is a partial replay's selection, with the accepted-before
	// bound it used (nil for a backfill or a whole-generation replay), and
	// Unmatched the selection's record keys of which it selected no event.
	Selection *ReplaySelection `json:"selection,omitempty"`
	Unmatched []string         `json:"unmatched_records,omitempty"`
	// Drained is the drain of what the pages made pending (zero when the
	// generation is not the active one).
	Drained DrainAllResult `json:"drained"`
}

// Backfill advances the backfill of a target created before protocol 4
// page by page until complete, each page its own transaction, draining
// what it enqueues as it goes when the target is the active one. It
// refuses while the SDK's baseline is incomplete. When ctx ends it stops
// between pages, with an error wrapping ErrInterrupted; a later run
// continues where it stopped.
func (s *Service) Backfill(ctx context.Context, workspaceID string, opts PagesOptions) (PagesResult, error) {
	return s.pages(ctx, workspaceID, opts, "backfill", func(ctx context.Context, st *store.Store, t store.Target) (pageLoop, error) {
		if !t.UsesDelivery() {
			return pageLoop{}, fmt.Errorf("%w: backfill needs protocol 4; the database is at %d (upgrade the SDK and run its migration)", store.ErrUnsupportedProtocol, t.DeliveryVersion)
		}
		total, err := st.BackfillTotal(ctx, t)
		if err != nil {
			return pageLoop{}, err
		}
		return pageLoop{total: total, complete: t.BackfillComplete, resumed: !t.BackfillComplete && string(t.BackfillCursor) != "{}",
			page: func(ctx context.Context) (int, bool, error) {
				page, err := st.AdvanceBackfill(ctx, t)
				return page.Rows, page.Complete, err
			}}, nil
	})
}

// Replay initialises a replay of a generation (constant time) and resets
// its events page by page, each page its own transaction, draining as it
// goes when the generation is the active one. A replay in progress is
// resumed, and so is one whose pages are done but whose events are not all
// published yet (unless opts.Restart). When ctx ends it stops between
// pages, with an error wrapping ErrInterrupted.
func (s *Service) Replay(ctx context.Context, workspaceID string, opts PagesOptions) (PagesResult, error) {
	return s.pages(ctx, workspaceID, opts, "replay", func(ctx context.Context, st *store.Store, t store.Target) (pageLoop, error) {
		if !t.BackfillComplete {
			return pageLoop{}, fmt.Errorf("generation %s has not been backfilled into the delivery queue: run `job backfill --workspace %s` first", t.Generation, workspaceID)
		}
		resumed := false
		switch {
		case t.UsesDelivery() && !t.ReplayComplete:
			s.log.InfoContext(ctx, "replication: resuming the replay in progress", slog.String("workspace", workspaceID), slog.String("generation", t.Generation))
			resumed = true
		case t.UsesDelivery() && !opts.Restart && t.InitialRevision != nil:
			undrained, err := st.ReplayUndrained(ctx, t)
			if err != nil {
				return pageLoop{}, err
			}
			if undrained {
				s.log.InfoContext(ctx, "replication: resuming the replay whose pages are done: draining its events", slog.String("workspace", workspaceID),
					slog.String("generation", t.Generation))
				return pageLoop{complete: true, resumed: true}, nil
			}
		}
		if !resumed {
			ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cmpDuration(opts.PageTimeout, 2*time.Minute))
			err := st.InitReplay(ictx, t)
			cancel()
			if err != nil {
				return pageLoop{}, err
			}
			if t, err = st.Target(ctx, t.Generation); err != nil {
				return pageLoop{}, err
			}
		}
		total, err := st.ReplayRemaining(ctx, t)
		if err != nil {
			return pageLoop{}, err
		}
		return pageLoop{total: total, resumed: resumed, page: func(ctx context.Context) (int, bool, error) {
			page, err := st.AdvanceReplay(ctx, t)
			return page.Rows, page.Complete, err
		}}, nil
	})
}

// DrainEveryPages is how many pages a backfill or a replay runs between
// turns of its drain: the pages and the drain's claims take turns, so that
// the database never runs both at once (which cost the server about a
// seventh more CPU for the same work in BenchmarkJobCost), and the events
// the pages made pending are published as the operation goes.
const DrainEveryPages = 10

// pageLoop is one operation's pages.
type pageLoop struct {
	total    int64
	complete bool // nothing to page
	resumed  bool
	page     func(ctx context.Context) (rows int, complete bool, err error)
}

// pages runs an operation's pages on the workspace's target, with the drain
// of the active generation alongside.
func (s *Service) pages(ctx context.Context, workspaceID string, opts PagesOptions, operation string,
	prepare func(ctx context.Context, st *store.Store, t store.Target) (pageLoop, error)) (PagesResult, error) {
	ws, err := s.Workspace(workspaceID)
	if err != nil {
		return PagesResult{}, err
	}
	st, err := s.lease(ctx, ws)
	if err != nil {
		return PagesResult{}, err
	}
	defer st.Release()
	// The set-up is retried through transient faults as the pages are: a
	// session ended before the first page (a failover) must not fail the
	// command. A retried start finds its replay in progress and resumes it.
	var (
		state store.State
		t     store.Target
		loop  pageLoop
	)
	err = s.retrying(ctx, operation, workspaceID, func() (err error) {
		if state, t, err = s.pagesTarget(ctx, st.store, opts.Generation); err != nil || !t.BaselineComplete {
			return err
		}
		loop, err = prepare(ctx, st.store, t)
		return err
	})
	res := PagesResult{Generation: t.Generation}
	if err != nil {
		return res, err
	}
	if !t.BaselineComplete {
		return res, fmt.Errorf("generation %s: %w; run %s after the SDK has finished it", t.Generation, store.ErrBaselineIncomplete, operation)
	}
	res.Resumed = loop.resumed
	progress := opts.Progress
	if progress == nil {
		progress = NoProgress{}
	}
	timeout := cmpDuration(opts.PageTimeout, 2*time.Minute)
	pr := &pageRun{svc: s, workspaceID: workspaceID, operation: operation, loop: loop, timeout: timeout, res: &res}
	run := func(ctx context.Context, drain func(context.Context) error) error {
		if loop.complete {
			return nil
		}
		tracker := progress.Start(operation, workspaceID, "rows", loop.total)
		err := pr.all(ctx, tracker, drain)
		tracker.Done(err)
		return err
	}
	if t.Generation != state.ActiveGeneration {
		return res, run(ctx, nil) // only the active generation is drained
	}
	drains := max(opts.Drains, 1)
	res.Drained, err = s.DrainAll(ctx, workspaceID, DrainAllOptions{Drains: drains, StepTimeout: timeout, Progress: progress, While: run})
	return res, err
}

// pageRun runs an operation's pages.
type pageRun struct {
	svc                    *Service
	workspaceID, operation string
	loop                   pageLoop
	timeout                time.Duration // a page's
	res                    *PagesResult
}

// all runs the pages until the loop is complete, each retried through
// transient faults, calling drain every DrainEveryPages pages; ctx's end
// stops it between pages.
func (r *pageRun) all(ctx context.Context, tracker Tracker, drain func(context.Context) error) error {
	for {
		if ctx.Err() != nil {
			return fmt.Errorf("%w after %d pages", ErrInterrupted, r.res.Pages)
		}
		// A page runs detached from ctx: an interrupt stops the
		// operation between pages, never inside one.
		var rows int
		var complete bool
		err := r.svc.retrying(ctx, r.operation+" page", r.workspaceID, func() error {
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
			defer cancel()
			var err error
			rows, complete, err = r.loop.page(pctx)
			return err
		})
		if err != nil && ctx.Err() != nil && Transient(err) {
			return fmt.Errorf("%w after %d pages (while waiting to retry: %w)", ErrInterrupted, r.res.Pages, err)
		}
		if err != nil {
			return err
		}
		r.res.Pages++
		r.res.Rows += rows
		tracker.Add(rows)
		if complete {
			return nil
		}
		if drain != nil && r.res.Pages%DrainEveryPages == 0 {
			if err := drain(ctx); err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("%w after %d pages", ErrInterrupted, r.res.Pages)
				}
				return err
			}
		}
	}
}

// pagesTarget returns the workspace's state and the target to work on: the
// generation's, or the active one.
func (s *Service) pagesTarget(ctx context.Context, st *store.Store, generation string) (store.State, store.Target, error) {
	state, active, err := st.ActiveTarget(ctx)
	if generation == "" {
		if errors.Is(err, store.ErrNoActiveTarget) {
			return state, active, fmt.Errorf("%w: start replication in the SDK first", err)
		}
		return state, active, err
	}
	if err != nil && !errors.Is(err, store.ErrNoActiveTarget) {
		return state, active, err
	}
	t, err := st.Target(ctx, generation)
	return state, t, err
}
