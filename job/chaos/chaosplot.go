package main

import (
	"strings"
	"sync"
	"time"

	"github.com/segmentstream/ontology-replication/shared/testbench/plots"
	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
)

// chaosSeries records the run's figures over time for its plot (--plot):
// the progress line's samples, every 250 ms.
type chaosSeries struct {
	mu      sync.Mutex
	started time.Time
	samples []sandbox.Sampled
}

func (s *chaosSeries) add(x sandbox.Sampled) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples = append(s.samples, x)
}

// plotChaos draws the run's timeline to path (see chaosTimeline).
func (c *chaosRun) plotChaos(path string, faultsOff time.Time) error {
	s := &c.series
	s.mu.Lock()
	samples := append([]sandbox.Sampled(nil), s.samples...)
	s.mu.Unlock()
	title := "chaos: " + c.cfg.duration.String() + " of faults, seed " + itoa(c.cfg.seed)
	verified := -1.0
	if c.report.FullyVerified {
		verified = c.report.VerifiedAfterFaultsSecs
	}
	return plots.SaveTimeline(path, chaosTimeline(title, c.started, samples, c.report.Timeline, faultsOff, verified))
}

// chaosTimeline is the run's picture: commits and publishes a second, the
// delivery and verification lags, every fault window in a lane of its
// kind (from its start for its length; an event, of no length, a tick),
// the operations' starts and ends, the faults' end and, when verifiedAfter
// is not negative, full verification that many seconds after it.
func chaosTimeline(title string, started time.Time, samples []sandbox.Sampled, timeline []timelineEntry, faultsOff time.Time,
	verifiedAfter float64) plots.Timeline {
	at := func(t time.Time) float64 { return t.Sub(started).Seconds() }
	var commits, published, delivery, verification []plots.XY
	for i, x := range samples {
		delivery = append(delivery, plots.XY{X: at(x.At), Y: x.DeliveryLag.Seconds()})
		verification = append(verification, plots.XY{X: at(x.At), Y: x.VerificationLag.Seconds()})
		// Rates over the last second of samples.
		j := i
		for j > 0 && x.At.Sub(samples[j-1].At) <= time.Second {
			j--
		}
		if span := x.At.Sub(samples[j].At).Seconds(); span > 0 {
			commits = append(commits, plots.XY{X: at(x.At), Y: float64(x.Commits-samples[j].Commits) / span})
			published = append(published, plots.XY{X: at(x.At), Y: float64(x.Published-samples[j].Published) / span})
		}
	}
	t := plots.Timeline{
		Title: title,
		Panels: []plots.Panel{
			{Title: "the SDK's commits and the messages published", YLabel: "per second", Series: []plots.Series{
				{Name: "commits/s", Points: commits}, {Name: "messages published/s", Points: published}}},
			{Title: "lags", YLabel: "seconds", Series: []plots.Series{
				{Name: "delivery lag (oldest pending)", Points: delivery}, {Name: "verification lag (oldest unverified)", Points: verification}}},
		},
		Moments: []plots.Marker{{Name: "faults end", At: at(faultsOff)}},
	}
	if verifiedAfter >= 0 {
		t.Moments = append(t.Moments, plots.Marker{Name: "every event verified", At: at(faultsOff) + verifiedAfter})
	}
	for _, e := range timeline {
		switch {
		case strings.HasSuffix(e.Kind, "_done"):
			t.Operations = append(t.Operations, plots.Marker{Name: strings.TrimSuffix(e.Kind, "_done") + " done", At: e.AtSeconds})
		case e.Kind == opReplay || e.Kind == opPartialReplay || e.Kind == opJobDrain:
			t.Operations = append(t.Operations, plots.Marker{Name: e.Kind, At: e.AtSeconds})
		default:
			t.Windows = append(t.Windows, plots.Window{Kind: e.Kind, From: e.AtSeconds, To: e.AtSeconds + e.ForSeconds})
		}
	}
	return t
}

func itoa(n uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}
