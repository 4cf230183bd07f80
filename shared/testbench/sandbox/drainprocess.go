package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/segmentstream/ontology-replication/shared/delivery"
)

// DrainProcess is one of the chaos run's drain instances: the deployed
// entry point (functions/cmd, FUNCTION_TARGET=Drain) run as a process of
// its own on a fixed loopback port, as a `replication-drain` Cloud Run
// instance runs it, so that its faults are a real process's: a restart as
// Cloud Run makes it (SIGTERM, the process's own stop, SIGKILL after a
// delay if still alive, a new process on the same port), a SIGKILL, and a
// freeze (SIGSTOP … SIGCONT). Each instance reaches the database under an
// application_name of its own (see startDrains).
type DrainProcess struct {
	Index  int
	Name   string // its application_name
	binary string
	env    []string
	port   int
	logs   io.Writer

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	// starts counts the processes started on its port: a wake-up sent to
	// the instance is answered by the process of its start.
	starts atomic.Int64
	Frozen atomic.Bool
	// Stopped, killed and stoppedSeen count the processes a restart saw
	// exit, those a kill saw exit, and the freezes seen in the kernel's
	// process state: the faults as the processes took them.
	Stopped, Killed, StoppedSeen atomic.Int64
	// Running counts the process's drainers running: one more for each
	// wake-up answered 2xx that started one (not coalesced), one less for
	// each drainer line that says it ended (delivery.LogDrainRun).
	Running atomic.Int64
	// Left is what its drainers left pending when a stop ended them
	// (delivery.LogDrainLeft).
	Left leftWork
	// RunEnds are its drainers' runs that ended, by process and run, with
	// the wake-ups their last claims covered (delivery.LogDrainRun).
	RunEnds runEnds
}

// RunKey is a drainer run of one process of an instance.
type RunKey struct {
	Start int64
	Run   uint64
}

// RunEnd is when a run ended and the wake-ups its last claim covered.
type RunEnd struct {
	At      time.Time
	Covered uint64
}

// runEnds records the runs' ends.
type runEnds struct {
	mu sync.Mutex
	m  map[RunKey]RunEnd
}

func (r *runEnds) add(k RunKey, e RunEnd) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[RunKey]RunEnd{}
	}
	r.m[k] = e
}

// Get returns run k's end, if its last line was seen.
func (r *runEnds) Get(k RunKey) (RunEnd, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.m[k]
	return e, ok
}

// leftWork sums the delivery.LogDrainLeft lines of a drain instance's
// processes: drainers that stopped with work left, the batches they
// released unacknowledged, the events of those Pub/Sub had taken (to be
// published again: duplicates), and those that stopped with wake-ups
// after their last claim.
type leftWork struct {
	drainers, released, unacknowledged, unclaimed atomic.Int64
}

// leftCounts is a snapshot of leftWork.
type leftCounts struct{ Drainers, released, unacknowledged, unclaimed int64 }

// Snapshot returns what the process's drainers said they left so far.
func (w *leftWork) Snapshot() leftCounts {
	return leftCounts{w.drainers.Load(), w.released.Load(), w.unacknowledged.Load(), w.unclaimed.Load()}
}

// Since says what was left since the snapshot before.
func (w *leftWork) Since(before leftCounts) string {
	now := w.Snapshot()
	if now.Drainers == before.Drainers {
		return "nothing pending"
	}
	return fmt.Sprintf("%s with work left (%s released, %d of their events published unacknowledged, %d with wake-ups unclaimed)",
		Plural(int(now.Drainers-before.Drainers), "drainer"), Plural(int(now.released-before.released), "batch"),
		now.unacknowledged-before.unacknowledged, now.unclaimed-before.unclaimed)
}

// add counts one LogDrainLeft line.
func (w *leftWork) add(released, unacknowledged int64, unclaimed bool) {
	w.drainers.Add(1)
	w.released.Add(released)
	w.unacknowledged.Add(unacknowledged)
	if unclaimed {
		w.unclaimed.Add(1)
	}
}

// awaitDrainers waits until the process's drainers have ended, or the
// process of start starts has ended, or ctx ends.
func (d *DrainProcess) awaitDrainers(ctx context.Context, starts int64) {
	for d.Running.Load() > 0 && d.starts.Load() == starts && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond) // the drainers' own lines move the counter: the signal
	}
}

// drainerLines watches a drain process's lines: each drainer's last line
// (delivery.LogDrainRun with ended) counts it out of running. The lines
// go on to out.
type drainerLines struct {
	d    *DrainProcess
	out  io.Writer
	part []byte
}

// Write reads the drain process's log lines as they come.
func (w *drainerLines) Write(p []byte) (int, error) {
	w.part = append(w.part, p...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			break
		}
		line := w.part[:i]
		var l struct {
			Message        string `json:"message"`
			Ended          bool   `json:"ended"`
			Released       int64  `json:"released"`
			Unacknowledged int64  `json:"unacknowledged"`
			Unclaimed      bool   `json:"wake_ups_unclaimed"`
			Run            uint64 `json:"run"`
			Covered        uint64 `json:"covered"`
		}
		if json.Unmarshal(line, &l) == nil {
			switch {
			case l.Message == delivery.LogDrainRun && l.Ended:
				w.d.RunEnds.add(RunKey{w.d.starts.Load(), l.Run}, RunEnd{At: time.Now(), Covered: l.Covered})
				w.d.Running.Add(-1)
			case l.Message == delivery.LogDrainLeft:
				w.d.Left.add(l.Released, l.Unacknowledged, l.Unclaimed)
			}
		}
		w.part = w.part[i+1:]
	}
	_, _ = w.out.Write(p)
	return len(p), nil
}

// buildDrain builds functions/cmd into dir, once for every instance.
func buildDrain(ctx context.Context, dir string) (string, error) {
	binary := filepath.Join(dir, "functions")
	build := exec.CommandContext(ctx, "go", "build", "-o", binary, "github.com/segmentstream/ontology-replication/functions/cmd")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("the chaos run builds the drain's entry point from source: run it inside the repository (go run ./job/chaos …): go build ./functions/cmd: %w: %s", err, bytes.TrimSpace(out))
	}
	return binary, nil
}

// newDrainProcess starts instance index of the binary with env (the
// registry and Pub/Sub address) on a free loopback port.
func newDrainProcess(ctx context.Context, index int, name, binary string, env []string, logs io.Writer) (*DrainProcess, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	d := &DrainProcess{Index: index, Name: name, binary: binary, env: env, port: port, logs: logs}
	if err := d.start(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// URL is the instance's base URL.
func (d *DrainProcess) URL() string { return fmt.Sprintf("http://127.0.0.1:%d", d.port) }

// start starts a process on the instance's port, listening on loopback
// only, and waits until it accepts connections.
func (d *DrainProcess) start(ctx context.Context) error {
	cmd := exec.Command(d.binary, "-addr", fmt.Sprintf("127.0.0.1:%d", d.port))
	// Only what the deployed service is given: none of the caller's
	// registry or credentials.
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "FUNCTION_TARGET=Drain"}, d.env...)
	// Its lines at INFO, for the drainers' ends; shown with the run's own
	// LOG_LEVEL.
	lines := &drainerLines{d: d, out: d.logs}
	cmd.Stdout, cmd.Stderr = lines, d.logs
	cmd.Env = append(cmd.Env, "LOG_LEVEL=INFO")
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the drain: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	d.cmd, d.exited = cmd, exited
	d.Running.Store(0)
	d.starts.Add(1)
	d.Frozen.Store(false)
	for delay := 5 * time.Millisecond; ; delay = min(delay*2, 200*time.Millisecond) {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", d.port), time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("the drain process exited at start (%v); LOG_LEVEL=INFO shows its lines", cmd.ProcessState)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// RestartResult is how a restart went.
type RestartResult struct {
	Stopped time.Duration // how long the old process took to end
	Killed  bool          // SIGKILL ended it, its own stop did not
}

// Restart stops the process as Cloud Run does, SIGTERM and SIGKILL killAfter
// later if it is still alive (the drain's own stop waits up to 8 s for the
// requests in flight, so a killAfter shorter than that can cut a drain),
// and starts a new one on the same port.
func (d *DrainProcess) Restart(ctx context.Context, killAfter time.Duration) (RestartResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd != nil {
		d.Stopped.Add(1) // stop returns once the process has exited
	}
	res := d.stop(killAfter)
	return res, d.start(ctx)
}

// Kill ends the process with SIGKILL (its sessions end with it; its
// requests in flight get no answer) and starts a new one.
func (d *DrainProcess) Kill(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd != nil {
		_ = d.cmd.Process.Kill()
		<-d.exited
		d.Killed.Add(1)
		d.cmd = nil
	}
	return d.start(ctx)
}

// Freeze stops the process (SIGSTOP) for d, then lets it go on (SIGCONT):
// an instance that hangs, its connections open.
func (d *DrainProcess) Freeze(ctx context.Context, hold time.Duration) {
	d.mu.Lock()
	cmd := d.cmd
	d.mu.Unlock()
	if cmd == nil {
		return
	}
	d.Frozen.Store(true)
	_ = cmd.Process.Signal(syscall.SIGSTOP)
	if processStopped(cmd.Process.Pid, time.Second) {
		d.StoppedSeen.Add(1)
	}
	SleepUntil(ctx, time.Now().Add(hold))
	_ = cmd.Process.Signal(syscall.SIGCONT)
	d.Frozen.Store(false)
}

func (d *DrainProcess) stop(killAfter time.Duration) RestartResult {
	started := time.Now()
	if d.cmd == nil {
		return RestartResult{}
	}
	_ = d.cmd.Process.Signal(syscall.SIGCONT) // a frozen one cannot stop itself
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	res := RestartResult{}
	select {
	case <-d.exited:
	case <-time.After(killAfter):
		_ = d.cmd.Process.Kill()
		<-d.exited
		res.Killed = true
	}
	d.cmd = nil
	res.Stopped = time.Since(started)
	return res
}

// processStopped waits, up to within, for the kernel to report process pid
// stopped (state T in /proc/<pid>/stat).
func processStopped(pid int, within time.Duration) bool {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		// pid (comm) state …: the state follows the last ')'.
		if i := bytes.LastIndexByte(raw, ')'); i >= 0 && i+2 < len(raw) && raw[i+2] == 'T' {
			return true
		}
	}
	return false
}

// Close stops the process.
func (d *DrainProcess) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stop(10 * time.Second)
}

// SleepUntil waits until t or ctx ends: false if ctx ended first.
func SleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
