package delivery

import (
	"context"

	"github.com/segmentstream/ontology-replication/shared/store"
)

// A drainer's batches after their publish: acknowledged (or set aside)
// in its next round trip, or released.

// finish finishes the ended batches without a claim.
func (r *drainRun) finish() {
	finish := r.ended
	r.ended = nil
	if len(finish) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(r.ctx, roundTimeout)
	defer cancel()
	err := finishOwn(ctx, finish)
	if r.ss != nil {
		if list := r.finishing(finish); len(list) > 0 {
			if _, _, _, serr := r.ss.Next(ctx, list, false); err == nil {
				err = serr
			}
		}
	}
	r.finished(finish)
	if err != nil && r.fault == nil {
		r.failed(err)
	}
}

// finishOwn finishes the ended batches claimed on sessions of their own
// (ClaimActive's: a protocol-3 database's), each in its own round trip.
func finishOwn(ctx context.Context, ended []published) error {
	var err error
	for _, p := range ended {
		if p.ss == nil {
			if _, ferr := p.claim.Finish(ctx, p.out.acceptedIDs(), p.out.aside); ferr != nil && err == nil {
				err = ferr
			}
		}
	}
	return err
}

// finishing is what a session's ended batches finish with: those of its
// current session (a batch of a session closed since has no claim left
// to finish: its events are pending again).
func (r *drainRun) finishing(ended []published) []store.Finishing {
	var list []store.Finishing
	for _, p := range ended {
		if p.ss != nil && p.ss == r.ss && !p.claim.Ended() {
			list = append(list, store.Finishing{Claim: p.claim, Accepted: p.out.acceptedIDs(), SetAside: p.out.aside})
		}
	}
	return list
}

// finished counts what the finished batches acknowledged and set aside,
// releases those whose acknowledgement failed (published, not
// acknowledged: published again later, duplicates) and takes their
// publishes' faults. A round of batches that all went through ends the
// drainer's failing and its backoff.
func (r *drainRun) finished(finish []published) {
	var fault error
	for _, p := range finish {
		switch {
		case p.claim.Ended() && (p.ss == nil || p.ss == r.ss):
			r.tally.add(p.out)
			r.s.asideWritten(r.ctx, r.d.ws, p.claim.Target(), p.out.aside)
		case p.ss == nil || p.ss == r.ss:
			p.claim.Release(r.ctx)
			r.tally.unacknowledged += len(p.out.accepted)
		default:
			r.tally.unacknowledged += len(p.out.accepted)
		}
		if p.out.err != nil && fault == nil {
			fault = p.out.err
		}
	}
	switch {
	case fault != nil:
		r.failed(fault)
	case len(finish) > 0 && r.fault == nil:
		r.d.setFailing(nil)
		r.backoff = firstBackoff
	}
	if r.ss != nil && r.ss.Dirty() {
		r.closeSession()
	}
}

// placeAside puts a lone event's batch, kept out while the claim beside
// it was made, with the batches to finish.
func (r *drainRun) placeAside() {
	if r.aside != nil {
		r.ended = append(r.ended, *r.aside)
		r.aside = nil
	}
}

// publishEnded takes a batch whose publish has ended. A lone event that failed
// as an event of its own may (see suspects) is kept out while the batch
// beside it is claimed at once (probe), so that the events behind it flow
// and their publish tells whether Pub/Sub works.
func (r *drainRun) publishEnded(p published) {
	r.out--
	o := p.out
	if r.aside == nil && !r.stopping && o.err != nil && o.failedAlone && !o.othersFailed && o.probe && len(p.claim.Events) == 1 && p.claim.More {
		r.aside, r.probe = &p, true
		return
	}
	r.ended = append(r.ended, p)
}
