package main

import (
	"strings"
	"sync"
	"time"

	"github.com/segmentstream/ontology-replication/shared/testbench/plots"
)

// chaosSeries records the run's figures over time for its plot (--plot):
// the progress line's samples, every 250 ms.
type chaosSeries struct {
	mu      sync.Mutex
	started time.Time
	samples []sampled
}

func (s *chaosSeries) add(x sampled) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples = append(s.samples, x)
}

// plotChaos draws the run's timeline to path: commits and publishes a
// second, the delivery and verification lags, every fault window in a lane
// of its kind, the operations, the faults' end and full verification.
func (c *chaosRun) plotChaos(path string, faultsOff time.Time) error {
	s := &c.series
	s.mu.Lock()
	samples := append([]sampled(nil), s.samples...)
	s.mu.Unlock()
	at := func(t time.Time) float64 { return t.Sub(c.started).Seconds() }
	var commits, published, delivery, verification []plots.XY
	for i, x := range samples {
		delivery = append(delivery, plots.XY{X: at(x.at), Y: x.deliveryLag.Seconds()})
		verification = append(verification, plots.XY{X: at(x.at), Y: x.verificationLag.Seconds()})
		// Rates over the last second of samples.
		j := i
		for j > 0 && x.at.Sub(samples[j-1].at) <= time.Second {
			j--
		}
		if span := x.at.Sub(samples[j].at).Seconds(); span > 0 {
			commits = append(commits, plots.XY{X: at(x.at), Y: float64(x.commits-samples[j].commits) / span})
			published = append(published, plots.XY{X: at(x.at), Y: float64(x.published-samples[j].published) / span})
		}
	}
	t := plots.Timeline{
		Title: "chaos: " + c.l.cfg.chaos.duration.String() + " of faults, seed " + itoa(c.l.cfg.chaos.seed),
		Panels: []plots.Panel{
			{Title: "the SDK's commits and the messages published", YLabel: "per second", Series: []plots.Series{
				{Name: "commits/s", Points: commits}, {Name: "messages published/s", Points: published}}},
			{Title: "lags", YLabel: "seconds", Series: []plots.Series{
				{Name: "delivery lag (oldest pending)", Points: delivery}, {Name: "verification lag (oldest unverified)", Points: verification}}},
		},
		Moments: []plots.Marker{{Name: "faults end", At: at(faultsOff)}},
	}
	if c.report.FullyVerified {
		t.Moments = append(t.Moments, plots.Marker{Name: "every event verified", At: at(faultsOff) + c.report.VerifiedAfterFaultsSecs})
	}
	for _, e := range c.report.Timeline {
		switch {
		case strings.HasSuffix(e.Kind, "_done"):
			t.Operations = append(t.Operations, plots.Marker{Name: strings.TrimSuffix(e.Kind, "_done") + " done", At: e.AtSeconds})
		case e.Kind == opReplay || e.Kind == opPartialReplay || e.Kind == opJobDrain:
			t.Operations = append(t.Operations, plots.Marker{Name: e.Kind, At: e.AtSeconds})
		default:
			t.Windows = append(t.Windows, plots.Window{Kind: e.Kind, From: e.AtSeconds, To: e.AtSeconds + e.ForSeconds})
		}
	}
	return plots.SaveTimeline(path, t)
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
