package functions

import (
	"net/http"
	"sync"
	"testing"

	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
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

// TestWakeUpsAnswerAtOnce: while a drainer's batch is out (its publish
// held), the wake-ups of later commits on its instance answer 200 at once,
// joined to the running drainer (coalesced), and one on another instance
// starts that instance's drainer; every answer promises, and once the
// publish is let go every commit is published.
func TestWakeUpsAnswerAtOnce(t *testing.T) {
	t.Parallel()
	gate := newPublishGate()
	h := newHarness(t, withReactor(pstest.ServerReactorOption{FuncName: "Publish", Reactor: gate}))
	defer gate.release()
	other := h.instance()
	h.products("w1", 1)
	code, body := h.wake("w1")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, map[string]any{"workspace": "w1", "promised": true, "coalesced": false, "run": 1.0, "wake": 1.0}, body)
	<-gate.held // the first batch is out
	for i := range 3 {
		h.products("w1", 1)
		code, body = h.wake("w1")
		require.Equal(t, http.StatusOK, code, body)
		require.Equal(t, map[string]any{"workspace": "w1", "promised": true, "coalesced": true, "run": 1.0, "wake": float64(i + 2)}, body,
			"joined the first run, as the next wake-up")
	}
	code, body = h.wakeOn(other, "w1")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, map[string]any{"workspace": "w1", "promised": true, "coalesced": false, "run": 1.0, "wake": 1.0}, body, "another process counts its own")
	require.Contains(t, h.logs.String(), `"coalesced":true`)
	gate.release()
	h.settle()
	// Each run's last line says it covered every wake-up it answered.
	covered := 0.0
	for _, l := range h.lines(delivery.LogDrainRun) {
		if l["ended"] == true && l["run"] == 1.0 {
			covered = max(covered, l["covered"].(float64))
		}
	}
	require.GreaterOrEqual(t, covered, 4.0, "the first run's last claim came after its fourth wake-up")
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
	require.Equal(t, 4, h.runs("w1").count)
}
