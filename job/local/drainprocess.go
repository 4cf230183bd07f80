package main

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

// drainProcess is one of the chaos run's drain instances: the deployed
// entry point (functions/cmd, FUNCTION_TARGET=Drain) run as a process of
// its own on a fixed loopback port, as a `replication-drain` Cloud Run
// instance runs it, so that its faults are a real process's: a restart as
// Cloud Run makes it (SIGTERM, the process's own stop, SIGKILL after a
// delay if still alive, a new process on the same port), a SIGKILL, and a
// freeze (SIGSTOP … SIGCONT). Each instance reaches the database under an
// application_name of its own (see startDrains).
type drainProcess struct {
	index  int
	name   string // its application_name
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
	frozen atomic.Bool
	// stopped, killed and stoppedSeen count the processes a restart saw
	// exit, those a kill saw exit, and the freezes seen in the kernel's
	// process state: the faults as the processes took them.
	stopped, killed, stoppedSeen atomic.Int64
	// running counts the process's drainers running: one more for each
	// wake-up answered 2xx that started one (not coalesced), one less for
	// each drainer line that says it ended (delivery.LogDrainRun).
	running atomic.Int64
	// left is what its drainers left pending when a stop ended them
	// (delivery.LogDrainLeft).
	left leftWork
	// runEnds are its drainers' runs that ended, by process and run, with
	// the wake-ups their last claims covered (delivery.LogDrainRun).
	runEnds runEnds
}

// runKey is a drainer run of one process of an instance.
type runKey struct {
	start int64
	run   uint64
}

// runEnd is when a run ended and the wake-ups its last claim covered.
type runEnd struct {
	at      time.Time
	covered uint64
}

// runEnds records the runs' ends.
type runEnds struct {
	mu sync.Mutex
	m  map[runKey]runEnd
}

func (r *runEnds) add(k runKey, e runEnd) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[runKey]runEnd{}
	}
	r.m[k] = e
}

func (r *runEnds) get(k runKey) (runEnd, bool) {
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
type leftCounts struct{ drainers, released, unacknowledged, unclaimed int64 }

func (w *leftWork) snapshot() leftCounts {
	return leftCounts{w.drainers.Load(), w.released.Load(), w.unacknowledged.Load(), w.unclaimed.Load()}
}

// since says what was left since the snapshot before.
func (w *leftWork) since(before leftCounts) string {
	now := w.snapshot()
	if now.drainers == before.drainers {
		return "nothing pending"
	}
	return fmt.Sprintf("%s with work left (%s released, %d of their events published unacknowledged, %d with wake-ups unclaimed)",
		plural(int(now.drainers-before.drainers), "drainer"), plural(int(now.released-before.released), "batch"),
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
func (d *drainProcess) awaitDrainers(ctx context.Context, starts int64) {
	for d.running.Load() > 0 && d.starts.Load() == starts && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond) // the drainers' own lines move the counter: the signal
	}
}

// drainerLines watches a drain process's lines: each drainer's last line
// (delivery.LogDrainRun with ended) counts it out of running. The lines
// go on to out.
type drainerLines struct {
	d    *drainProcess
	out  io.Writer
	part []byte
}

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
				w.d.runEnds.add(runKey{w.d.starts.Load(), l.Run}, runEnd{at: time.Now(), covered: l.Covered})
				w.d.running.Add(-1)
			case l.Message == delivery.LogDrainLeft:
				w.d.left.add(l.Released, l.Unacknowledged, l.Unclaimed)
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
		return "", fmt.Errorf("--chaos builds the drain's entry point from source: run it inside the repository (go run ./job/local --chaos …): go build ./functions/cmd: %w: %s", err, bytes.TrimSpace(out))
	}
	return binary, nil
}

// newDrainProcess starts instance index of the binary with env (the
// registry and Pub/Sub address) on a free loopback port.
func newDrainProcess(ctx context.Context, index int, name, binary string, env []string, logs io.Writer) (*drainProcess, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	d := &drainProcess{index: index, name: name, binary: binary, env: env, port: port, logs: logs}
	if err := d.start(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// URL is the instance's base URL.
func (d *drainProcess) URL() string { return fmt.Sprintf("http://127.0.0.1:%d", d.port) }

// start starts a process on the instance's port, listening on loopback
// only, and waits until it accepts connections.
func (d *drainProcess) start(ctx context.Context) error {
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
	d.running.Store(0)
	d.starts.Add(1)
	d.frozen.Store(false)
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

// restartResult is how a restart went.
type restartResult struct {
	stopped time.Duration // how long the old process took to end
	killed  bool          // SIGKILL ended it, its own stop did not
}

// restart stops the process as Cloud Run does, SIGTERM and SIGKILL killAfter
// later if it is still alive (the drain's own stop waits up to 8 s for the
// requests in flight, so a killAfter shorter than that can cut a drain),
// and starts a new one on the same port.
func (d *drainProcess) restart(ctx context.Context, killAfter time.Duration) (restartResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd != nil {
		d.stopped.Add(1) // stop returns once the process has exited
	}
	res := d.stop(killAfter)
	return res, d.start(ctx)
}

// kill ends the process with SIGKILL (its sessions end with it; its
// requests in flight get no answer) and starts a new one.
func (d *drainProcess) kill(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd != nil {
		_ = d.cmd.Process.Kill()
		<-d.exited
		d.killed.Add(1)
		d.cmd = nil
	}
	return d.start(ctx)
}

// freeze stops the process (SIGSTOP) for d, then lets it go on (SIGCONT):
// an instance that hangs, its connections open.
func (d *drainProcess) freeze(ctx context.Context, hold time.Duration) {
	d.mu.Lock()
	cmd := d.cmd
	d.mu.Unlock()
	if cmd == nil {
		return
	}
	d.frozen.Store(true)
	_ = cmd.Process.Signal(syscall.SIGSTOP)
	if processStopped(cmd.Process.Pid, time.Second) {
		d.stoppedSeen.Add(1)
	}
	sleepUntil(ctx, time.Now().Add(hold))
	_ = cmd.Process.Signal(syscall.SIGCONT)
	d.frozen.Store(false)
}

func (d *drainProcess) stop(killAfter time.Duration) restartResult {
	started := time.Now()
	if d.cmd == nil {
		return restartResult{}
	}
	_ = d.cmd.Process.Signal(syscall.SIGCONT) // a frozen one cannot stop itself
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	res := restartResult{}
	select {
	case <-d.exited:
	case <-time.After(killAfter):
		_ = d.cmd.Process.Kill()
		<-d.exited
		res.killed = true
	}
	d.cmd = nil
	res.stopped = time.Since(started)
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
func (d *drainProcess) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stop(10 * time.Second)
}

// sleepUntil waits until t or ctx ends: false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
