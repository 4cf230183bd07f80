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
	// Run is the drainer run that carries it, this process's nth run of
	// the workspace's drainer, and Wake its place among the workspace's
	// wake-ups at this process: the run's last line (LogDrainRun, ended)
	// reports the wake-ups its last claim covered, at least Wake.
	Run  uint64 `json:"run"`
	Wake uint64 `json:"wake"`
}

// ErrDrainRetrying answers a wake-up while its workspace's drainer in this
// process backs off after a fault: the drainer claims its commit once it
// recovers, but promises nothing meanwhile (HTTP 503, which the SDK logs as
// deferred).
var ErrDrainRetrying = errors.New("the workspace's drain is retrying after a fault; this commit is left to it")

// ErrShuttingDown answers a wake-up once the process has begun to stop
// (Shutdown; HTTP 503).
var ErrShuttingDown = errors.New("the drain is shutting down")

// drainers are this process's drainers, one per workspace that has work.
type drainers struct {
	mu       sync.Mutex
	m        map[string]*drainer
	stopping bool
	wg       sync.WaitGroup
	running  int           // drainers running
	idle     chan struct{} // closed while none runs
	// stop is closed when the process begins to stop (no more claims, the
	// batches out finished), abandon when its grace has run out (the
	// batches out released).
	stop, abandon chan struct{}
}

func newDrainers() *drainers {
	idle := make(chan struct{})
	close(idle)
	return &drainers{m: map[string]*drainer{}, stop: make(chan struct{}), abandon: make(chan struct{}), idle: idle}
}

// drainer is this process's drain of one workspace: each wake-up counts
// itself (wakes) and makes sure it runs; it claims after the wake-ups it
// counted and stops only when none came after its last claim (nextStep).
// mu guards its fields; the run's own state is drainRun's.
type drainer struct {
	svc  *Service
	ws   registry.Workspace
	kick chan struct{} // a wake-up came (capacity 1)

	mu       sync.Mutex
	wakes    uint64 // wake-ups counted
	runs     uint64 // runs started
	running  bool
	failing  error    // the fault it backs off from: wake-ups get ErrDrainRetrying
	arrivals arrivals // how often the workspace's wake-ups reach this process
}

// Wake is a wake-up of a workspace's drain, which the ontology service
// sends after every commit and awaits inside the customer's action. It
// answers at once, with no database or network call: the workspace's
// drainer in this process counts it, and starts if it is not running.
// The answer is a promise (Promised): this drainer claims after the
// wake-up and publishes its commit, retrying whatever it meets for as long
// as the process lives (see A wake-up's word in the package doc). While
// the drainer backs off after a fault the answer is ErrDrainRetrying, once
// the process stops ErrShuttingDown: nothing promised.
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
		d.runs++
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
	ans.Run, ans.Wake = d.runs, d.wakes
	d.mu.Unlock()
	ds.mu.Unlock()
	if failing != nil {
		return ans, fmt.Errorf("%w: %w", ErrDrainRetrying, failing)
	}
	ans.Promised = true
	return ans, nil
}

// snapshot reads the wake-ups counted, and whether the workspace is busy.
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

// stop ends the drainer's run, unless a wake-up came after its last claim
// (covered: the wakes it began after) and the process is not stopping; it
// reports whether it ended (a wake-up from now on starts another run).
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

// ended counts a run out of the running drainers (see Idle).
func (ds *drainers) ended() {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if ds.running--; ds.running == 0 {
		close(ds.idle)
	}
}

// arrivals is the mean time between a workspace's wake-ups at this
// process, each new interval weighing a third and counted as maxInterval
// at most: a burst is busy within half a dozen wake-ups, and one pause of
// maxInterval makes the workspace quiet again.
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

// Shutdown stops the drain as Cloud Run stops an instance (SIGTERM, then
// SIGKILL 10 s later): wake-ups get ErrShuttingDown; each drainer still
// claims what it promised (the wake-ups it answered 2xx), at once, finishes
// its batches and ends (SPEC §3: it ends its work within the grace). When
// ctx ends first, whatever step a drainer is in is cut and the batches
// still out are released unacknowledged (one Pub/Sub took is
// published again later: a duplicate). A drainer that leaves work behind
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

// Idle waits until no drainer of the process runs, or ctx ends: every
// wake-up answered so far has been carried out.
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
