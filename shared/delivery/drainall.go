package delivery

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"
)

// DrainAllOptions configures DrainAll.
type DrainAllOptions struct {
	// Drains is how many batches are out at once: claimed and being
	// published. Default: 1. The batches are claimed and acknowledged on
	// one connection of the workspace's pool (a store.Session), whatever
	// their number. On a legacy (protocol 3) database one drain runs
	// whatever Drains says: its scan locks nothing, so drains side by side
	// would publish the same events.
	Drains int
	// StepTimeout bounds each step: a round trip of the session, a batch's
	// publish. Default: 2m.
	StepTimeout time.Duration
	// Progress shows the drain's progress. Default: NoProgress.
	Progress Progress
	// While, when not nil, runs beside the drain (backfill or replay pages
	// making events pending) and takes turns with it: While calls drain
	// to have the drain publish what is pending now, and drain returns once
	// nothing publishable is left (or with the drain's failure). The drain
	// claims nothing between those calls, so that the database never runs
	// a page and a claim at once. When While has returned, the drain
	// publishes what is left, and DrainAll ends.
	While func(ctx context.Context, drain func(context.Context) error) error
}

// DrainAllResult is what DrainAll did.
type DrainAllResult struct {
	// Published and SetAside count events.
	Published int `json:"published"`
	SetAside  int `json:"set_aside"`
	// Paused reports that replication was disabled or lost its active
	// target meanwhile: the drains stopped, and the next run carries on.
	Paused bool `json:"paused,omitempty"`
	// State is the replication state the drains last saw.
	State string `json:"state,omitempty"`
}

// ErrInterrupted is the error of work stopped by its context between
// steps: what was done is committed.
var ErrInterrupted = errors.New("interrupted")

// DrainAll publishes a workspace's pending events until nothing publishable
// is left (events set aside are counted, not retried), with Drains batches
// out at once. Each batch is acknowledged only after Pub/Sub accepted it.
// At protocol 4 the batches are claimed and acknowledged on one session
// (store.Session): one round trip acknowledges the batches whose publishes
// have ended and claims the next, so that the drain holds one connection
// and its batches never contend for the same events. When ctx ends, the
// drain stops claiming, and the batches out are published and acknowledged
// (each step runs on a context detached from ctx, bounded by StepTimeout);
// the error then wraps ErrInterrupted. A transient fault ends the session:
// what was acknowledged is kept, the rest stays pending, and a new session
// carries on after a pause (see RetryPolicy). While's error comes first.
func (s *Service) DrainAll(ctx context.Context, workspaceID string, opts DrainAllOptions) (DrainAllResult, error) {
	ws, err := s.Workspace(workspaceID)
	if err != nil {
		return DrainAllResult{}, err
	}
	d := &bulkDrain{svc: s, ws: ws, ctx: ctx, turns: make(chan chan error)}
	d.drains = max(opts.Drains, 1)
	d.step = cmpDuration(opts.StepTimeout, 2*time.Minute)
	progress := opts.Progress
	if progress == nil {
		progress = NoProgress{}
	}
	// The workspace's pool stays open for the whole drain: its session and
	// the pages of While take connections of it, and none is opened per
	// batch.
	held, err := s.hold(ctx, workspaceID)
	if err != nil {
		return DrainAllResult{}, err
	}
	defer held()
	d.tracker = progress.Start("drain", workspaceID, "events", 0)
	g, gctx := errgroup.WithContext(context.WithoutCancel(ctx))
	d.gctx = gctx
	d.produced = make(chan struct{})
	if opts.While != nil {
		d.producing.Store(true)
		g.Go(func() error {
			defer close(d.produced)
			defer d.producing.Store(false)
			return opts.While(ctx, d.turn)
		})
	} else {
		close(d.produced)
	}
	g.Go(d.run)
	err = g.Wait()
	res := d.result()
	if err == nil && ctx.Err() != nil {
		err = fmt.Errorf("%w after %d events", ErrInterrupted, res.Published)
	}
	d.tracker.Done(err)
	return res, err
}
