package delivery_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/logbuf"
)

// TestConnectionsAreReportedByServer: a process reports, each interval,
// the connections it opened to each server in it (the churn the server
// pays), and nothing for an interval in which it opened none.
func TestConnectionsAreReportedByServer(t *testing.T) {
	t.Parallel()
	var logs logbuf.Buffer
	r := newRig(t, 2, withService(func(c *delivery.Config) { c.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) }))
	ctx, stop := context.WithCancel(r.ctx)
	defer stop()
	go r.svc.ReportConnections(ctx, 50*time.Millisecond)
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "woken"})
	require.NoError(t, err)
	r.wakeOK(t, r.svc)
	r.settle(t)
	count := func() int { return strings.Count(logs.String(), `"msg":"`+delivery.LogConnections+`"`) }
	require.Eventually(t, func() bool { return count() > 0 }, time.Minute, 10*time.Millisecond, "the drainer's connections reported")
	line := logs.String()[strings.Index(logs.String(), `"msg":"`+delivery.LogConnections+`"`):]
	line = line[:strings.IndexByte(line, '\n')]
	require.Regexp(t, `"server":"[^"]+","opened":[1-9][0-9]*,"open":[0-9]+,"interval_s":0`, line)
	lines := count()
	time.Sleep(200 * time.Millisecond) // four intervals with no connection opened: the absence is the signal
	require.Equal(t, lines, count(), "no line for an interval with none opened")
}
