package delivery

import (
	"log/slog"
	"time"
)

// What a drainer says: a line of what it published (LogDrainRun), a
// warning per fault (LogDrainFault), and what it left when its process
// stopped (LogDrainLeft).

// LogDrainRun is a drainer's line: what it published since its last line,
// written when its run ends and every runLineEvery while it runs (the
// fields count, batches, bytes, set_aside, claims, requests, publish_ms,
// turn_wait_ms, faults, duration_ms; state and generation; run, the
// run's number, and covered, the wake-ups its last claim began after: a
// run that ended covered every wake-up it answered, WakeAnswer.Wake).
// terraform's delivery metrics read it.
const LogDrainRun = "replication drain run"

// LogDrainFault is the warning of a drainer step that failed (ERROR when
// the fault needs a person): the drainer answers wake-ups 503 and claims
// again after backoff_ms. cause and error say what it met.
const LogDrainFault = "replication: the drain met a fault; it claims again after a backoff"

// LogDrainLeft is the warning of a drainer that ended because its process
// stopped, with work left: wake_ups_unclaimed (wake-ups after its last
// claim), released (batches out or published, their claims released) and
// unacknowledged (events Pub/Sub accepted that were not acknowledged: they
// are published again, as duplicates). The next wake-up, any instance's,
// or the verifier's sweep publishes what is pending.
const LogDrainLeft = "replication: the drain stopped with work left"

// LogDrainHeld is the DEBUG line of a drainer whose claim found pending
// events held by other claims: it looks at them again after backoff_ms, in
// case their holder never publishes them.
const LogDrainHeld = "replication: pending events are held by other claims; the drain looks again"

// runLineEvery is how often a running drainer writes its line.
const runLineEvery = time.Minute

// runTally is what a drainer did since its last line.
type runTally struct {
	since                                         time.Time
	published, setAside, bytes, batches, requests int
	publishTime, waited                           time.Duration
	claims, faults                                int
	// unacknowledged counts events Pub/Sub accepted whose acknowledgement
	// failed or was given up; released the batches given up at a stop.
	unacknowledged, released int
	state, generation        string
}

// add counts a finished batch.
func (t *runTally) add(o *publishing) {
	t.published += len(o.accepted)
	t.setAside += len(o.aside)
	t.requests += o.requests
	t.publishTime += o.elapsed
	if len(o.accepted) > 0 {
		t.bytes += o.bytes()
		t.batches++
	} else if len(o.aside) > 0 {
		t.batches++
	}
}

// logEvery writes the line of a drainer that has run for runLineEvery
// since its last, and starts a new tally.
func (t *runTally) logEvery(r *drainRun) {
	if time.Since(t.since) < runLineEvery {
		return
	}
	t.write(r, false)
	*t = runTally{since: time.Now(), state: t.state, generation: t.generation}
}

// log writes the run's last line and, when its process stopped with work
// left, LogDrainLeft.
func (t *runTally) log(r *drainRun, unclaimed bool) {
	t.write(r, true)
	if (r.stopping || r.abandoned) && (unclaimed || t.released > 0 || t.unacknowledged > 0 || r.fault != nil) {
		attrs := []any{slog.String("workspace", r.d.ws.ID), slog.Bool("wake_ups_unclaimed", unclaimed),
			slog.Int("released", t.released), slog.Int("unacknowledged", t.unacknowledged)}
		if r.fault != nil {
			attrs = append(attrs, slog.String("cause", Cause(r.fault)), slog.String("error", r.fault.Error()))
		}
		r.s.log.WarnContext(r.ctx, LogDrainLeft, attrs...)
	}
}

func (t *runTally) write(r *drainRun, ended bool) {
	r.s.log.InfoContext(r.ctx, LogDrainRun, slog.String("workspace", r.d.ws.ID), slog.String("generation", t.generation),
		slog.String("state", t.state), slog.Int("count", t.published), slog.Int("batches", t.batches), slog.Int("bytes", t.bytes),
		slog.Int("set_aside", t.setAside), slog.Int("claims", t.claims), slog.Int("requests", t.requests),
		slog.Int64("publish_ms", t.publishTime.Milliseconds()), slog.Int64("turn_wait_ms", t.waited.Milliseconds()),
		slog.Int("faults", t.faults), slog.Int64("duration_ms", time.Since(t.since).Milliseconds()), slog.Bool("ended", ended),
		slog.Uint64("run", r.run), slog.Uint64("covered", r.covered))
}
