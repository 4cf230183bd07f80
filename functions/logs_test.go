package functions

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
)

type lockedWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// Len is how many bytes were written so far.
func (w *lockedWriter) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Len()
}

// Reset forgets what was written.
func (w *lockedWriter) Reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Reset()
}

// String is what was written so far.
func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// settle waits, a minute at most, until no instance runs a drainer: every
// wake-up answered so far has been carried out.
func (h *harness) settle() {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.ctx, time.Minute)
	defer cancel()
	for _, srv := range h.servers {
		require.NoError(h.t, srv.svc.Idle(ctx), "a drainer still runs after a minute")
	}
}

// awaitLogged waits, a minute at most, until the logs hold text (the
// product's own signal).
func (h *harness) awaitLogged(text string) {
	h.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(h.logs.String(), text) {
		require.True(h.t, time.Now().Before(deadline), "not logged within a minute: %q", text)
		time.Sleep(5 * time.Millisecond) // polling the log: the signal itself
	}
}

// logged returns a numeric field of every line whose message is message.
func (h *harness) logged(message, field string) []float64 {
	h.t.Helper()
	var out []float64
	for _, l := range h.lines(message) {
		if v, ok := l[field].(float64); ok {
			out = append(out, v)
		}
	}
	return out
}

// lines returns every line whose message is message, decoded.
func (h *harness) lines(message string) []map[string]any {
	h.t.Helper()
	var out []map[string]any
	for line := range strings.SplitSeq(h.logs.String(), "\n") {
		var l map[string]any
		if json.Unmarshal([]byte(line), &l) == nil && l["message"] == message {
			out = append(out, l)
		}
	}
	return out
}

// runTotals is what the drainers' lines of a workspace say they did.
type runTotals struct {
	count, batches, bytes, setAside int
	states                          []string
}

// runs sums the drainers' lines (delivery.LogDrainRun) of a workspace
// logged so far.
func (h *harness) runs(workspace string) runTotals {
	h.t.Helper()
	var tot runTotals
	for line := range strings.SplitSeq(h.logs.String(), "\n") {
		if !strings.Contains(line, delivery.LogDrainRun) {
			continue
		}
		var l struct {
			Message, Workspace, State string
			Count, Batches, Bytes     int
			SetAside                  int `json:"set_aside"`
		}
		require.NoError(h.t, json.Unmarshal([]byte(line), &l), line)
		if l.Message != delivery.LogDrainRun || l.Workspace != workspace {
			continue
		}
		tot.count += l.Count
		tot.batches += l.Batches
		tot.bytes += l.Bytes
		tot.setAside += l.SetAside
		tot.states = append(tot.states, l.State)
	}
	return tot
}
