package main

import (
	"cmp"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/registry"
)

// drainers is how many drains of a workspace run at once: one per
// connection of its pool, less the one the pages use while they run. Claims
// lock their rows FOR UPDATE SKIP LOCKED, so concurrent drains publish
// disjoint batches, as concurrent wake-ups of the drain function do.
func drainers(ws registry.Workspace, paging bool) int {
	n := cmp.Or(ws.Database.MaxConns, registry.DefaultMaxConns)
	if paging {
		n--
	}
	return int(max(n, 1))
}

// drainIdle is how long a drain with nothing to publish waits before it
// looks again while pages are still making events pending.
const drainIdle = 25 * time.Millisecond

// drainWhile publishes a workspace's pending events with several drains at
// once while produce (when not nil) runs in the calling goroutine and makes
// more events pending, and then until nothing publishable is left. Each
// batch is acknowledged only after Pub/Sub accepted it, by the same code as
// the drain function. produce's error comes first; a drain's error stops
// the other drains and produce's pages are left to finish on their own
// terms. An interrupt stops the drains after their current batch.
func (e *env) drainWhile(ws registry.Workspace, produce func() error) error {
	d := e.progress.start("drain", ws.ID, "events", 0)
	if produce != nil {
		d.mute() // the pages show progress until they are done
	}
	var (
		produced = make(chan struct{}) // closed when produce has returned
		stop     = make(chan struct{}) // closed to stop the drains early
		stopOnce sync.Once
		mu       sync.Mutex
		drainErr error
		paused   sync.Once
		wg       sync.WaitGroup
	)
	halt := func(err error) {
		if err != nil {
			mu.Lock()
			drainErr = cmp.Or(drainErr, err)
			mu.Unlock()
		}
		stopOnce.Do(func() { close(stop) })
	}
	for range drainers(ws, produce != nil) {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if e.ctx.Err() != nil {
					return
				}
				producing := !closed(produced)
				ctx, cancel := e.page()
				res, err := e.svc.Drain(ctx, ws.ID)
				cancel()
				if err != nil {
					halt(fmt.Errorf("workspace %s: drain: %w", ws.ID, err))
					return
				}
				if res.State != delivery.StateActive {
					// Paused (an SDK migration or a new generation) or never
					// started: nothing may be published now; the next run will.
					paused.Do(func() {
						e.log.Warn("drain stopped: replication is "+strings.ReplaceAll(res.State, "_", " "), "workspace", ws.ID)
					})
					return
				}
				if res.Published > 0 || res.SetAside > 0 {
					d.add(res.Published)
					if res.More {
						continue
					}
				}
				if !producing {
					return // nothing publishable left once the pages were done
				}
				select {
				case <-produced:
				case <-stop:
				case <-time.After(drainIdle):
				}
			}
		})
	}
	var err error
	if produce != nil {
		err = produce()
		if err != nil {
			halt(nil)
		}
		d.unmute()
	}
	close(produced)
	wg.Wait()
	d.done()
	switch {
	case err != nil:
		return err
	case drainErr != nil:
		return drainErr
	case e.ctx.Err() != nil:
		return interrupted("drain", ws.ID, d.pages)
	}
	return nil
}

func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
