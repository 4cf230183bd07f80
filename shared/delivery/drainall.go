package delivery

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/segmentstream/ontology-replication/shared/registry"
)

// Progress receives the progress of long work, to show it (a live line on a
// terminal, log lines otherwise). Its methods may be called from several
// goroutines.
type Progress interface {
	// Start begins an operation ("drain", "backfill", "replay") on a
	// workspace, counting unit ("events", "rows"), total of them when known
	// (0 otherwise).
	Start(operation, workspace, unit string, total int64) Tracker
}

// Tracker follows one operation.
type Tracker interface {
	// Add records a finished step (a batch or a page) of n units.
	Add(n int)
	// Done ends the operation: err is nil when it finished, wraps
	// ErrInterrupted when it was stopped, and is its failure otherwise.
	Done(err error)
}

// NoProgress shows nothing.
type NoProgress struct{}

// Start implements Progress.
func (NoProgress) Start(string, string, string, int64) Tracker { return noTracker{} }

type noTracker struct{}

func (noTracker) Add(int)    {}
func (noTracker) Done(error) {}

// DrainAllOptions configures DrainAll.
type DrainAllOptions struct {
	// Drains is how many drains run at once. Default: 1. Claims are
	// disjoint, as for concurrent wake-ups of the drain function; each drain
	// holds one connection of the workspace's pool while its batch is out.
	Drains int
	// StepTimeout bounds each batch. Default: 2m.
	StepTimeout time.Duration
	// Progress shows the drain's progress. Default: NoProgress.
	Progress Progress
	// While, when not nil, runs while the drains run (backfill or replay
	// pages making events pending); the drains then wait for more work until
	// it has returned, and end when nothing publishable is left.
	While func(ctx context.Context) error
	// Idle is how long a drain that found nothing waits before it looks
	// again while While runs. Default: 25ms.
	Idle time.Duration
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

// DrainAll publishes a workspace's pending events with several drains at
// once until nothing publishable is left (events set aside are counted, not
// retried). Each batch is acknowledged only after Pub/Sub accepted it, by
// the same code as the drain function. When ctx ends, the drains stop after
// their current batch (each batch runs on a context detached from ctx,
// bounded by StepTimeout) and the error wraps ErrInterrupted. While's error
// comes first; a drain's error stops the other drains.
func (s *Service) DrainAll(ctx context.Context, workspaceID string, opts DrainAllOptions) (DrainAllResult, error) {
	if _, err := s.Workspace(workspaceID); err != nil {
		return DrainAllResult{}, err
	}
	drains := max(opts.Drains, 1)
	step := cmpDuration(opts.StepTimeout, 2*time.Minute)
	idle := cmpDuration(opts.Idle, 25*time.Millisecond)
	progress := opts.Progress
	if progress == nil {
		progress = NoProgress{}
	}
	var (
		res       DrainAllResult
		mu        sync.Mutex
		producing atomic.Bool
		produced  = make(chan struct{})
		paused    atomic.Bool
	)
	// The workspace's pool stays open for the whole drain: each batch takes
	// a connection of it, and none is opened per batch.
	held, err := s.hold(ctx, workspaceID)
	if err != nil {
		return DrainAllResult{}, err
	}
	defer held()
	tracker := progress.Start("drain", workspaceID, "events", 0)
	g, gctx := errgroup.WithContext(context.WithoutCancel(ctx))
	if opts.While != nil {
		producing.Store(true)
		g.Go(func() error {
			defer close(produced)
			defer producing.Store(false)
			return opts.While(ctx)
		})
	} else {
		close(produced)
	}
	for range drains {
		g.Go(func() error {
			for {
				if ctx.Err() != nil || gctx.Err() != nil || paused.Load() {
					return nil
				}
				wasProducing := producing.Load()
				var r DrainResult
				// Retries end with the command, or when another drain failed.
				rctx, stop := context.WithCancel(gctx)
				unhook := context.AfterFunc(ctx, stop)
				err := s.retrying(rctx, "drain", workspaceID, func() error {
					bctx, cancel := context.WithTimeout(gctx, step)
					defer cancel()
					var err error
					r, err = s.Drain(bctx, workspaceID)
					if r.Published > 0 || r.SetAside > 0 {
						// Acknowledged before the failure: counted once,
						// never published again by the retry.
						mu.Lock()
						res.Published += r.Published
						res.SetAside += r.SetAside
						mu.Unlock()
						tracker.Add(r.Published)
						if err != nil {
							r.Published, r.SetAside = 0, 0
						}
					}
					return err
				})
				unhook()
				stop()
				if err != nil {
					if ctx.Err() != nil && Transient(err) {
						return nil // interrupted while waiting to retry
					}
					return fmt.Errorf("drain: %w", err)
				}
				if r.State != StateActive {
					paused.Store(true)
					mu.Lock()
					res.State = r.State
					mu.Unlock()
					return nil
				}
				mu.Lock()
				res.State = r.State
				mu.Unlock()
				if (r.Published > 0 || r.SetAside > 0) && r.More {
					continue
				}
				if !wasProducing {
					return nil // nothing publishable left once the pages were done
				}
				select {
				case <-produced:
				case <-gctx.Done():
				case <-ctx.Done():
				case <-time.After(idle):
				}
			}
		})
	}
	err = g.Wait()
	res.Paused = paused.Load()
	if err == nil && ctx.Err() != nil {
		err = fmt.Errorf("%w after %d events", ErrInterrupted, res.Published)
	}
	tracker.Done(err)
	return res, err
}

func cmpDuration(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// WorkspaceResult is what a command did for one workspace.
type WorkspaceResult struct {
	Workspace string
	// Err is the workspace's failure, nil when it succeeded.
	Err error
	// Detail is the command's own summary of the workspace.
	Detail any
}

// ForEach is the package's ForEach with each workspace's database pool held
// open for the whole of fn: the command's steps on a workspace (its pages,
// batches, reads) share the pool's connections, none is opened per step,
// and the pool closes when the workspace is done (where the pools close
// when idle, as the job's do), so that at most parallel pools are open
// however many workspaces the command walks.
func (s *Service) ForEach(ctx context.Context, workspaces []registry.Workspace, parallel int, fn func(ctx context.Context, ws registry.Workspace) (any, error)) []WorkspaceResult {
	return ForEach(ctx, workspaces, parallel, func(ctx context.Context, ws registry.Workspace) (any, error) {
		held, err := s.hold(ctx, ws.ID)
		if err != nil {
			return nil, err
		}
		defer held()
		return fn(ctx, ws)
	})
}

// hold keeps a workspace's pool open until the returned function is called.
func (s *Service) hold(ctx context.Context, workspaceID string) (func(), error) {
	ws, err := s.Workspace(workspaceID)
	if err != nil {
		return nil, err
	}
	l, err := s.cfg.Pools.Acquire(ctx, ws)
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

// ForEach runs fn for each workspace, at most parallel at a time (default
// 1), carrying on past a workspace that fails: every workspace gets its
// result, in the order given. When ctx ends, workspaces not begun are
// reported interrupted.
func ForEach(ctx context.Context, workspaces []registry.Workspace, parallel int, fn func(ctx context.Context, ws registry.Workspace) (any, error)) []WorkspaceResult {
	results := make([]WorkspaceResult, len(workspaces))
	var g errgroup.Group
	g.SetLimit(max(parallel, 1))
	for i, ws := range workspaces {
		results[i].Workspace = ws.ID
		if ctx.Err() != nil {
			results[i].Err = fmt.Errorf("%w before it began", ErrInterrupted)
			continue
		}
		g.Go(func() error {
			if ctx.Err() != nil {
				results[i].Err = fmt.Errorf("%w before it began", ErrInterrupted)
				return nil
			}
			results[i].Detail, results[i].Err = fn(ctx, ws)
			return nil
		})
	}
	_ = g.Wait()
	return results
}
