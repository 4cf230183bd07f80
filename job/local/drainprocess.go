package main

import (
	"bytes"
	"context"
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
)

// drainProcess is the chaos run's drain: the deployed entry point
// (functions/cmd, FUNCTION_TARGET=Drain) built and run as a process of its
// own on a fixed loopback port, as the `replication-drain` Cloud Run
// service runs it, so that its restart is the one Cloud Run makes: SIGTERM,
// the process's own stop (no new connections, the requests in flight get
// their grace), SIGKILL if it is still alive 10 s later, then a new
// process on the same port.
type drainProcess struct {
	binary string
	env    []string
	port   int
	logs   io.Writer

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	restarts atomic.Int64
}

// buildDrainProcess builds functions/cmd into dir and starts it with env
// (the registry and Pub/Sub address), on a free loopback port.
func buildDrainProcess(ctx context.Context, dir string, env []string, logs io.Writer) (*drainProcess, error) {
	binary := filepath.Join(dir, "functions")
	build := exec.CommandContext(ctx, "go", "build", "-o", binary, "github.com/segmentstream/ontology-replication/functions/cmd")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("--chaos builds the drain's entry point from source: run it inside the repository (go run ./job/local --chaos …): go build ./functions/cmd: %w: %s", err, bytes.TrimSpace(out))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	d := &drainProcess{binary: binary, env: env, port: port, logs: logs}
	if err := d.start(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// URL is the drain's base URL.
func (d *drainProcess) URL() string { return fmt.Sprintf("http://127.0.0.1:%d", d.port) }

// start starts the process and waits until it accepts connections.
func (d *drainProcess) start(ctx context.Context) error {
	cmd := exec.Command(d.binary, "-port", fmt.Sprint(d.port))
	// Only what the deployed service is given: none of the caller's
	// registry or credentials.
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "FUNCTION_TARGET=Drain"}, d.env...)
	cmd.Stdout, cmd.Stderr = d.logs, d.logs
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the drain: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	d.cmd, d.exited = cmd, exited
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

// restart stops the process as Cloud Run does (SIGTERM, SIGKILL 10 s later)
// and starts a new one on the same port. It returns how long the old one
// took to stop.
func (d *drainProcess) restart(ctx context.Context) (time.Duration, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	stopped := d.stop()
	d.restarts.Add(1)
	return stopped, d.start(ctx)
}

func (d *drainProcess) stop() time.Duration {
	started := time.Now()
	if d.cmd == nil {
		return 0
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(10 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
	d.cmd = nil
	return time.Since(started)
}

// Close stops the process.
func (d *drainProcess) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stop()
}
