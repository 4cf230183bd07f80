package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ServerCPU is the CPU time the local PostgreSQL server behind db has used
// so far: the postmaster and every process it started (backends,
// autovacuum, the writers), running or ended, from /proc. On a shared machine it is the
// fairest cost figure for benchmarks: it does not count the benchmark's own
// CPU or an emulator's. It fails when the server's processes are not
// visible (a remote server).
func ServerCPU(ctx context.Context, backendPID func(ctx context.Context) (int, error)) (time.Duration, error) {
	backend, err := backendPID(ctx)
	if err != nil {
		return 0, fmt.Errorf("pgtest: the server's backend pid: %w", err)
	}
	// stat reads a process's parent and CPU ticks: its own, and those of
	// its children that have exited and been waited for (a backend's time
	// moves to the postmaster's when the session ends).
	stat := func(pid int) (ppid int, ticks int64, ok bool) {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, 0, false
		}
		// The fields after the command name, which is in parentheses:
		// state, ppid, …, utime (14th), stime, cutime, cstime.
		fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
		ppid, _ = strconv.Atoi(fields[1])
		for _, f := range fields[11:15] {
			n, _ := strconv.ParseInt(f, 10, 64)
			ticks += n
		}
		return ppid, ticks, true
	}
	postmaster, _, ok := stat(backend)
	if !ok {
		return 0, errors.New("pgtest: no /proc entry for the server's processes: ServerCPU needs a local server")
	}
	_, total, _ := stat(postmaster)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ticks, ok := stat(pid); ok && ppid == postmaster {
			total += ticks
		}
	}
	return time.Duration(total) * 10 * time.Millisecond, nil // USER_HZ is 100
}

// BackendCPU samples the CPU time of a local server's backends by the
// application_name their sessions report, from /proc, while it runs:
// the fairest figure for what each client costs the server when several
// share it. A backend's time is read at every sample and kept once it
// ends, so a session that closes between samples loses at most one
// sample's worth. Stop ends the sampling and returns the CPU each
// application used since Start.
type BackendCPU struct {
	stop chan struct{}
	done chan map[string]time.Duration
}

// SampleBackendCPU starts sampling the backends of the server behind
// admin (a superuser's pool, which sees every session) every interval.
func SampleBackendCPU(ctx context.Context, admin interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, interval time.Duration) (*BackendCPU, error) {
	return sampleProcesses(ctx, admin, interval, `SELECT pid, application_name FROM pg_stat_activity WHERE backend_type = 'client backend'`)
}

// sampleProcesses samples the CPU of the processes query lists (pid and
// the key their time counts under) every interval.
func sampleProcesses(ctx context.Context, admin interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, interval time.Duration, query string) (*BackendCPU, error) {
	type backend struct {
		app          string
		first, ticks int64
	}
	seen := map[int]*backend{}
	sample := func() error {
		rows, err := admin.Query(ctx, query)
		if err != nil {
			return err
		}
		var pid int
		var app string
		_, err = pgx.ForEachRow(rows, []any{&pid, &app}, func() error {
			ticks, ok := processTicks(pid)
			if !ok {
				return nil
			}
			b := seen[pid]
			if b == nil || b.app != app {
				b = &backend{app: app, first: ticks}
				seen[pid] = b
			}
			b.ticks = ticks
			return nil
		})
		return err
	}
	if err := sample(); err != nil {
		return nil, fmt.Errorf("pgtest: sample the backends: %w", err)
	}
	c := &BackendCPU{stop: make(chan struct{}), done: make(chan map[string]time.Duration, 1)}
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				_ = sample()
				continue
			case <-c.stop:
			}
			_ = sample()
			out := map[string]time.Duration{}
			for _, b := range seen {
				out[b.app] += time.Duration(b.ticks - b.first)
			}
			c.done <- out
			return
		}
	}()
	return c, nil
}

// Stop ends the sampling and returns the CPU by application_name.
func (c *BackendCPU) Stop() map[string]time.Duration {
	close(c.stop)
	return <-c.done
}

// processTicks reads the time a process has run on a CPU, in
// nanoseconds: /proc/<pid>/schedstat's first field, which the scheduler
// keeps to the nanosecond (stat's utime and stime count 10 ms ticks, too
// coarse for a backend that runs a few milliseconds a second).
func processTicks(pid int) (int64, bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0, false
	}
	fields := strings.Fields(string(raw))
	if len(fields) == 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(fields[0], 10, 64)
	return n, err == nil
}

// Ended is the key of ServerSample's figure for the time of processes
// that ended between samples (a session opened and closed between two of
// them): the server's whole CPU (ServerCPU, which counts ended children)
// less what the samples saw.
const Ended = "(ended)"

// ServerSample samples a local server's CPU by process while it runs:
// client backends by their application_name, other processes by
// "bg:"+backend_type (autovacuum, the checkpointer, …), and, on Stop, what
// ended between samples (Ended). Each figure is the CPU since Start.
type ServerSample struct {
	sampled  *BackendCPU
	total    time.Duration
	pid      func(ctx context.Context) (int, error)
	ctx      context.Context
	startErr error
}

// SampleServerCPU starts sampling the server behind admin (a superuser's
// pool) every interval.
func SampleServerCPU(ctx context.Context, admin interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, interval time.Duration) (*ServerSample, error) {
	pid := func(ctx context.Context) (int, error) {
		var p int
		err := admin.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&p)
		return p, err
	}
	total, err := ServerCPU(ctx, pid)
	if err != nil {
		return nil, err
	}
	sampled, err := sampleProcesses(ctx, admin, interval, `SELECT pid, CASE WHEN backend_type = 'client backend' THEN application_name
		ELSE 'bg:' || backend_type END FROM pg_stat_activity`)
	if err != nil {
		return nil, err
	}
	return &ServerSample{sampled: sampled, total: total, pid: pid, ctx: ctx}, nil
}

// Stop ends the sampling and returns the CPU by application, background
// process kind, and Ended.
func (s *ServerSample) Stop() (map[string]time.Duration, error) {
	out := s.sampled.Stop()
	total, err := ServerCPU(s.ctx, s.pid)
	if err != nil {
		return out, err
	}
	seen := time.Duration(0)
	for _, d := range out {
		seen += d
	}
	out[Ended] = max(0, total-s.total-seen)
	return out, nil
}
