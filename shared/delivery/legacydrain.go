package delivery

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// each drains a legacy database as concurrent wake-ups of the drain
// function do: Drains drains, each claiming, publishing and acknowledging
// one batch at a time on a connection of its own (the SDK's legacy scan
// locks nothing; see store.ClaimActive), until nothing publishable is
// left, in While's turns. Each batch is retried on its own.
func (d *bulkDrain) each() error {
	for {
		if !d.awaitTurn() {
			return nil
		}
		wasProducing := d.producing.Load()
		paused, err := d.eachRound()
		if err != nil {
			return err
		}
		d.endTurn()
		if paused || !wasProducing || d.stopped() {
			return nil
		}
	}
}

// eachRound runs the legacy drains until none finds anything to publish;
// it reports whether replication was paused.
func (d *bulkDrain) eachRound() (bool, error) {
	s := d.svc
	g, gctx := errgroup.WithContext(d.gctx)
	var paused atomic.Bool
	for range d.drains {
		g.Go(func() error {
			for {
				if d.ctx.Err() != nil || gctx.Err() != nil || paused.Load() {
					return nil
				}
				var r DrainResult
				rctx, stop := context.WithCancel(gctx)
				unhook := context.AfterFunc(d.ctx, stop)
				err := s.retrying(rctx, "drain", d.ws.ID, func() error {
					bctx, cancel := context.WithTimeout(gctx, d.step)
					defer cancel()
					var err error
					r, err = s.drainOnce(bctx, d.ws.ID)
					// Acknowledged before the failure: counted once, never
					// published again by the retry.
					d.count(r.Published, r.SetAside)
					if err != nil {
						r.Published, r.SetAside = 0, 0
					}
					return err
				})
				unhook()
				stop()
				if err != nil {
					if d.ctx.Err() != nil && Transient(err) {
						return nil // interrupted while waiting to retry
					}
					return fmt.Errorf("drain: %w", err)
				}
				if r.State != StateActive {
					paused.Store(true)
					d.pause(r.State)
					return nil
				}
				d.setState(r.State)
				if (r.Published > 0 || r.SetAside > 0) && r.More {
					continue
				}
				return nil // nothing publishable left for this drain
			}
		})
	}
	err := g.Wait()
	return paused.Load(), err
}

func cmpDuration(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
