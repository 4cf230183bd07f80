package pgtest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ClientConnections counts this process's TCP connections to the cluster:
// its sockets (/proc/self/fd) that /proc/net/tcp lists as established to the
// cluster's port. It returns -1 where /proc is not there.
func (c *Cluster) ClientConnections() int {
	port := c.admin.Port()
	n, err := strconv.Atoi(port)
	if err != nil {
		return -1
	}
	raw, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return -1
	}
	hexPort := fmt.Sprintf("%04X", n)
	toServer := map[string]bool{} // socket inodes
	for _, line := range strings.Split(string(raw), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 || f[3] != "01" { // 01: ESTABLISHED
			continue
		}
		if remote := strings.Split(f[2], ":"); len(remote) == 2 && remote[1] == hexPort {
			toServer[f[9]] = true
		}
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	count := 0
	for _, fd := range fds {
		link, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if err == nil && strings.HasPrefix(link, "socket:[") && toServer[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
			count++
		}
	}
	return count
}

// WatchClientConnections samples ClientConnections every millisecond until
// stop is called, and returns the most it saw. The server's
// max_connections is the hard bound; this is the figure to report.
func (c *Cluster) WatchClientConnections(t testing.TB) (stop func() int64) {
	t.Helper()
	if c.ClientConnections() < 0 {
		t.Fatal("pgtest: counting connections needs /proc")
	}
	var peak atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			if n := int64(c.ClientConnections()); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	return func() int64 {
		close(done)
		wg.Wait()
		return peak.Load()
	}
}
