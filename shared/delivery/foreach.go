package delivery

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"

	"github.com/segmentstream/ontology-replication/shared/registry"
)

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
