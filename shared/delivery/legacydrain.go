package delivery

import (
	"context"
	"time"
)

// each drains a legacy database as a wake-up of the drain function does,
// one batch at a time: read, publish, acknowledge, until nothing
// publishable is left, in While's turns. Each batch is retried on its own.
//
// One drain, whatever Drains says: the SDK's legacy scan locks nothing
// (see store.ClaimActive), so drains run side by side all read the same
// first batch of events without a receipt and each publishes it; four of
// them published 750 events 2,450 times (TestLegacyDrainPublishesEachEventOnce).
// They add no throughput either: the scan, not the publish, is the cost.
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

// eachRound drains until nothing is left to publish; it reports whether
// replication was paused.
func (d *bulkDrain) eachRound() (bool, error) {
	s := d.svc
	for {
		if d.ctx.Err() != nil || d.gctx.Err() != nil {
			return false, nil
		}
		var r DrainResult
		rctx, stop := context.WithCancel(d.gctx)
		unhook := context.AfterFunc(d.ctx, stop)
		err := s.retrying(rctx, "drain", d.ws.ID, func() error {
			bctx, cancel := context.WithTimeout(d.gctx, d.step)
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
				return false, nil // interrupted while waiting to retry
			}
			return false, err
		}
		if r.State != StateActive {
			d.pause(r.State)
			return true, nil
		}
		d.setState(r.State)
		if (r.Published == 0 && r.SetAside == 0) || !r.More {
			return false, nil // nothing publishable left
		}
	}
}

func cmpDuration(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
