package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
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
