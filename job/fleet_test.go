package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// openConnections counts this process's TCP connections to port: its
// sockets (/proc/self/fd) that /proc/net/tcp lists as established to it.
func openConnections(port int) int {
	raw, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return -1
	}
	toServer := map[string]bool{} // socket inodes
	for _, line := range strings.Split(string(raw), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 || f[3] != "01" { // 01: ESTABLISHED
			continue
		}
		if remote := strings.Split(f[2], ":"); len(remote) == 2 && remote[1] == fmt.Sprintf("%04X", port) {
			toServer[f[9]] = true
		}
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	n := 0
	for _, fd := range fds {
		link, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if err == nil && strings.HasPrefix(link, "socket:[") && toServer[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
			n++
		}
	}
	return n
}

// watchConnections samples this process's connections to the cluster
// until stop is called, and returns the most it saw.
func watchConnections(t *testing.T, c *pgtest.Cluster) (stop func() int64) {
	t.Helper()
	u, err := url.Parse(c.AdminURL())
	require.NoError(t, err)
	port, err := strconv.Atoi(u.Port())
	require.NoError(t, err)
	require.GreaterOrEqual(t, openConnections(port), 0, "needs /proc")
	var peak atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			if n := int64(openConnections(port)); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
	})
	return func() int64 {
		close(done)
		wg.Wait()
		return peak.Load()
	}
}

// TestFortyWorkspacesWithinTheConnectionBudget: `job drain` and `job
// verify` over 40 workspaces whose databases share one PostgreSQL server
// with max_connections 100 both succeed, and the job's connections (this
// process's, the test's own pools being emptied first) never pass the
// documented bound: --parallel (4) pools of DATABASE_POOL_SIZE (4)
// connections.
func TestFortyWorkspacesWithinTheConnectionBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server of its own with 40 databases")
	}
	t.Parallel()
	ctx := context.Background()
	c, err := pgtest.Start(ctx, pgtest.Config{Settings: map[string]string{"max_connections": "100"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	templates := make([]*pgtest.Template, 40)
	for i := range templates {
		templates[i] = &sdkfixture.V4Template
	}
	h := newHarnessOn(t, c, templates...)
	for i := range templates {
		id := fmt.Sprintf("w%d", i+1)
		h.start(id)
		h.products(id, 30)
		h.spaces[id].pool.Reset() // the test's own connections go
	}
	stop := watchConnections(t, c)
	h.mustRun("drain")
	h.mustRun("verify", "--budget", "2m")
	peak := stop()
	t.Logf("peak connections of the job: %d", peak)
	require.LessOrEqual(t, peak, int64(4*4), "within --parallel × DATABASE_POOL_SIZE")
	require.Positive(t, peak)
	for i := range templates {
		id := fmt.Sprintf("w%d", i+1)
		require.Len(t, h.published(id), 30, id)
		require.EqualValues(t, 30, h.count(id, "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NOT NULL"), id)
		h.spaces[id].pool.Reset()
	}
}
