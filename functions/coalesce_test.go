package functions

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"
)

// publishGate holds every Publish request until opened; held receives a
// value as each one arrives.
type publishGate struct {
	held chan struct{}
	open chan struct{}
	once sync.Once
}

func newPublishGate() *publishGate {
	return &publishGate{held: make(chan struct{}, 16), open: make(chan struct{})}
}

func (g *publishGate) React(any) (bool, any, error) {
	select {
	case <-g.open:
	default:
		g.held <- struct{}{}
		<-g.open
	}
	return false, nil, nil
}

func (g *publishGate) release() { g.once.Do(func() { close(g.open) }) }

// TestCoalescedWakeUpAnswers: while a drain's batch is out and another
// wake-up of the instance holds the next turn and its claim waits for the
// turn, of two more wake-ups of the instance one is its pending drain,
// which waits for the drains ahead of it, and the other answers 200 at once
// with coalesced and nothing published, and its log line says where it met
// the drain. The drain that was next then publishes the commits. A
// wake-up on another instance is that instance's pending drain: it waits
// too, and finds nothing left.
func TestCoalescedWakeUpAnswers(t *testing.T) {
	t.Parallel()
	gate := newPublishGate()
	// Every wake-up takes turns, as on a busy workspace.
	h := newHarness(t, withReactor(pstest.ServerReactorOption{FuncName: "Publish", Reactor: gate}), withEnv(EnvDrainQuietInterval, "0"))
	defer gate.release()
	other := h.instance()
	h.products("w1", 1)
	type answer struct {
		code int
		body map[string]any
	}
	first, second, later := make(chan answer, 1), make(chan answer, 1), make(chan answer, 3)
	go func() { c, b := h.wake("w1"); first <- answer{c, b} }()
	<-gate.held // the first drain's batch is out
	h.products("w1", 2)
	go func() { c, b := h.wake("w1"); second <- answer{c, b} }()
	// It holds the next turn, and its claim waits for the turn.
	for h.count("w1", `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND wait_event_type = 'Lock' AND wait_event = 'advisory'`) == 0 {
		select {
		case a := <-second:
			t.Fatalf("the second wake-up did not wait for the turn: %d %v", a.code, a.body)
		case <-time.After(5 * time.Millisecond): // the server's lock table is the signal
		}
	}
	for range 2 {
		go func() { c, b := h.wake("w1"); later <- answer{c, b} }()
	}
	coalesced := <-later // the other waits for the drains ahead of it
	require.Equal(t, http.StatusOK, coalesced.code, coalesced.body)
	require.Equal(t, map[string]any{"workspace": "w1", "published": 0.0, "batches": 0.0, "more": false, "bytes": 0.0, "coalesced": true}, coalesced.body)
	require.Contains(t, h.logs.String(), `"coalesced":"instance"`)
	go func() { c, b := h.wakeOn(other, "w1"); later <- answer{c, b} }()
	gate.release()
	a := <-first
	require.Equal(t, http.StatusOK, a.code)
	require.Equal(t, 1.0, a.body["published"])
	b := <-second
	require.Equal(t, http.StatusOK, b.code)
	require.Equal(t, 2.0, b.body["published"])
	require.Contains(t, h.logs.String(), `"waited_ms"`)
	for range 2 {
		c := <-later
		require.Equal(t, http.StatusOK, c.code)
		require.Equal(t, 0.0, c.body["published"], "the drains that came after found nothing left")
		require.Nil(t, c.body["coalesced"])
	}
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}
