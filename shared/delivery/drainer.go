package delivery

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentstream/ontology-replication/shared/registry"
)

// WakeAnswer is what a wake-up was answered (Service.Wake).
type WakeAnswer struct {
	Workspace string `json:"workspace"`
	// Promised: the workspace's drainer in this process claims after this
	// wake-up, and so publishes its commit (see Wake).
	Promised bool `json:"promised"`
	// Coalesced: the drainer was already running; the wake-up joined it
	// and started nothing.
	Coalesced bool `json:"coalesced"`
}

// ErrDrainRetrying answers a wake-up while its workspace's drainer in this
// process is failing (its last claim, publish or acknowledgement failed,
// and it backs off before it claims again): the commit is left to that
// drainer, which claims it once it recovers, but no promise is made on a
// failing drainer (an HTTP caller gets 503, which the SDK logs as
// deferred).
var ErrDrainRetrying = errors.New("the workspace's drain is retrying after a fault; this commit is left to it")

// ErrShuttingDown answers a wake-up once the process has begun to stop
// (Shutdown): its commit is left to the next wake-up or the verifier's
// sweep (503).
var ErrShuttingDown = errors.New("the drain is shutting down")

// drainers are this process's drainers, one per workspace that has work,
// and what stops them.
type drainers struct {
	mu       sync.Mutex
	m        map[string]*drainer
	stopping bool
	wg       sync.WaitGroup
	// running counts the drainers running; idle is closed while none runs.
	running int
	idle    chan struct{}
	// stop is closed when the process begins to stop: drainers claim
	// nothing more and finish their batches out; abandon when its grace
	// has run out: they end at once, their batches released.
	stop, abandon chan struct{}
}

func newDrainers() *drainers {
	idle := make(chan struct{})
	close(idle)
	return &drainers{m: map[string]*drainer{}, stop: make(chan struct{}), abandon: make(chan struct{}), idle: idle}
}

// drainer is this process's drain of one workspace. Every wake-up of the
// workspace that reaches the process counts itself (wakes) and makes sure
// the drainer runs; the drainer claims after the wake-ups it has counted
// and stops only when none came after its last claim (see nextStep). Its
// fields are guarded by mu; the run's own state is drainRun's.
type drainer struct {
	svc  *Service
	ws   registry.Workspace
	kick chan struct{} // a wake-up came (capacity 1)

	mu      sync.Mutex
	wakes   uint64 // wake-ups counted
	running bool
	// failing is the fault the drainer backs off from, nil when its last
	// step succeeded: wake-ups meanwhile are answered ErrDrainRetrying.
	failing error
	// arrivals is how often the workspace's wake-ups reach this process.
	arrivals arrivals
}

// Wake is a wake-up of a workspace's drain, which the ontology service
// sends after every commit and awaits inside the customer's action. It
// answers at once, with no database or network call: the workspace's
// drainer in this process counts the wake-up and is started if it is not
// running; it claims after every wake-up it counted, publishes, and goes
// on while more is pending or a wake-up came after its last claim.
//
// Its answer is a promise (Promised): the commit is published by this
// process's drainer, never left to a later wake-up or the verifier's sweep,
// whatever the drainer meets (a slow Pub/Sub, a lost session, a migration
// holding the lifecycle lock, another instance frozen while it holds the
// events): it retries with a backoff for as long as the process lives. A
// wake-up that comes while the drainer is failing is answered
// ErrDrainRetrying (503): its commit is still claimed once the drainer
// recovers, but nothing is promised. Once the process stops (Shutdown) a
// wake-up is answered ErrShuttingDown.
func (s *Service) Wake(ctx context.Context, ws registry.Workspace) (WakeAnswer, error) {
	ans := WakeAnswer{Workspace: ws.ID}
	ds := s.drainers
	ds.mu.Lock()
	if ds.stopping {
		ds.mu.Unlock()
		return ans, ErrShuttingDown
	}
	d := ds.m[ws.ID]
	if d == nil {
		d = &drainer{svc: s, ws: ws, kick: make(chan struct{}, 1)}
		ds.m[ws.ID] = d
	}
	d.mu.Lock()
	d.wakes++
	d.arrivals.arrived(time.Now())
	failing := d.failing
	ans.Coalesced = d.running
	if !d.running {
		d.running = true
		if ds.running == 0 {
			ds.idle = make(chan struct{})
		}
		ds.running++
		ds.wg.Add(1)
		go d.run(context.WithoutCancel(ctx))
	} else {
		select {
		case d.kick <- struct{}{}:
		default:
		}
	}
	d.mu.Unlock()
	ds.mu.Unlock()
	if failing != nil {
		return ans, fmt.Errorf("%w: %w", ErrDrainRetrying, failing)
	}
	ans.Promised = true
	return ans, nil
}

// snapshot reads what the drainer's rules need of the wake-ups: how many
// were counted, and whether the workspace is busy.
func (d *drainer) snapshot(quiet time.Duration) (wakes uint64, busy bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.wakes, quiet < 0 || d.arrivals.interval() < quiet
}

// setFailing marks the drainer failing (err) or not (nil).
func (d *drainer) setFailing(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failing = err
}

// stop ends the drainer's run unless a wake-up came after its last claim
// (covered: the wakes its last claim began after) and the process is not
// stopping; it reports whether it ended. The caller's run returns (a
// wake-up from now on starts another), and counts itself out of the
// running drainers (ended) once its session, lease and line are done.
func (d *drainer) stop(covered uint64) bool {
	ds := d.svc.drainers
	ds.mu.Lock()
	defer ds.mu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.wakes != covered && !ds.stopping {
		return false
	}
	d.running = false
	return true
}

// ended counts a run out of the running drainers: the last one out makes
// the process idle (Idle).
func (ds *drainers) ended() {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if ds.running--; ds.running == 0 {
		close(ds.idle)
	}
}

// arrivals is how often a workspace's wake-ups reach this process: the
// mean time between them, each new interval weighing a third, a pause
// counted as maxInterval at most (so a burst after a quiet spell is busy
// within half a dozen wake-ups, and one pause of maxInterval makes the
// workspace quiet again).
type arrivals struct {
	last   time.Time
	mean   time.Duration
	loaded bool
}

// maxInterval bounds arrivals' mean interval.
const maxInterval = time.Second

func (a *arrivals) arrived(now time.Time) {
	dt := maxInterval
	if !a.last.IsZero() {
		dt = min(now.Sub(a.last), maxInterval)
	}
	a.last = now
	if !a.loaded {
		a.mean, a.loaded = dt, true
		return
	}
	a.mean = (2*a.mean + dt) / 3
}

func (a *arrivals) interval() time.Duration {
	if !a.loaded {
		return maxInterval
	}
	return a.mean
}

// Shutdown stops the drain as Cloud Run stops an instance (SIGTERM, and
// SIGKILL 10 s later): wake-ups from now on are answered ErrShuttingDown;
// each drainer claims nothing more, publishes and acknowledges its batches
// out, and ends. When ctx ends first, the drainers still running release
// their batches unacknowledged (published or not: a batch Pub/Sub took is
// published again later, a duplicate) and end. Each drainer that leaves
// work behind (wake-ups after its last claim, batches released, a fault)
// logs it (LogDrainLeft). It returns once every drainer has ended, with
// ctx's error when the grace ran out.
func (s *Service) Shutdown(ctx context.Context) error {
	ds := s.drainers
	ds.mu.Lock()
	if !ds.stopping {
		ds.stopping = true
		close(ds.stop)
	}
	ds.mu.Unlock()
	done := make(chan struct{})
	go func() { ds.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	ds.mu.Lock()
	select {
	case <-ds.abandon:
	default:
		close(ds.abandon)
	}
	ds.mu.Unlock()
	<-done
	return fmt.Errorf("delivery: stop the drainers: %w", context.Cause(ctx))
}

// Idle waits until no drainer of the process runs, or ctx ends: the
// signal that every wake-up answered so far has been carried out (tests,
// and the local mode's checks, wait on it).
func (s *Service) Idle(ctx context.Context) error {
	ds := s.drainers
	for {
		ds.mu.Lock()
		idle, running := ds.idle, ds.running
		ds.mu.Unlock()
		if running == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-idle:
		}
	}
}

// runs reports whether this process's drainer of the workspace runs.
func (ds *drainers) runs(workspace string) bool {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	d := ds.m[workspace]
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.running
}
