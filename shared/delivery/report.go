package delivery

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/store"
)

// What a pass reports: its log lines, the lag bands, and the events sent
// back to pending again and again.

// Messages of the verifier's log lines: the log-based metrics of terraform
// select them (a test checks that the filters and these agree).
const (
	// LogVerifyWorkspace is a workspace's line in a pass: its outcome,
	// what it verified, and its figures (lags and backlogs).
	LogVerifyWorkspace = "replication verify workspace"
)

// A Band is one of the bands a lag is reported in.
type Band struct {
	// Name is the band's label value, such as "under_5m".
	Name string
	// Under is the band's upper bound (exclusive); zero for the last
	// band, which has none.
	Under time.Duration
}

// LagBands returns the bands a lag is reported in on the verifier's lines
// (as labels of a counter, which costs a sixth of a distribution in Cloud
// Monitoring), shortest first: each names the bound it is under, the last
// one is over the last bound.
func LagBands() []Band {
	return []Band{
		{"under_1m", time.Minute}, {"under_5m", 5 * time.Minute}, {"under_15m", 15 * time.Minute},
		{"under_30m", 30 * time.Minute}, {"under_1h", time.Hour}, {"over_1h", 0},
	}
}

// BandUnknown is the bands' value on the line of a workspace that failed
// before its figures could be read: its lags are not known, and count as
// out of bounds.
const BandUnknown = "unknown"

// LagBand returns the band of a lag.
func LagBand(d time.Duration) string {
	bands := LagBands()
	for _, b := range bands {
		if b.Under == 0 || d < b.Under {
			return b.Name
		}
	}
	return bands[len(bands)-1].Name
}

// logWorkspace writes a workspace's line of a pass: at ERROR when it
// failed, WARN when it was not reached, INFO otherwise.
func (s *Service) logWorkspace(ctx context.Context, r VerifyResult) {
	level := slog.LevelInfo
	switch r.Outcome {
	case OutcomeFailed:
		level = slog.LevelError
	case OutcomeNotReached:
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{
		slog.String("workspace", r.Workspace), slog.String("outcome", r.Outcome),
		slog.Int("rounds", r.Rounds), slog.Int("checked", r.Checked), slog.Int("verified", r.Verified),
		slog.Int("retried", r.Retried), slog.Int("requeued", r.Requeued), slog.Int("swept", r.Swept),
		slog.Float64("lookup_seconds", r.LookupTime.Seconds()),
	}
	if r.Generation != "" {
		attrs = append(attrs, slog.String("generation", r.Generation))
	}
	if f := r.Figures; f != nil {
		// An event set aside waits as a pending one does, for a person:
		// its lag is reported apart and counts in the outstanding band
		// (the SLO's), so that an event that will never arrive on its own
		// makes the SLO bad.
		now := time.Now()
		pending, unverified := f.Ages(now)
		setAside := f.SetAsideAge(now)
		outstanding := max(pending, unverified, setAside)
		attrs = append(attrs, slog.Int64("pending", f.Pending), slog.Int64("set_aside", f.SetAside),
			slog.Int64("unverified", f.Unverified), slog.Int64("due_verifications", f.DueVerifications),
			slog.Float64("oldest_pending_age_seconds", pending.Seconds()), slog.Float64("oldest_unverified_age_seconds", unverified.Seconds()),
			slog.Float64("oldest_set_aside_age_seconds", setAside.Seconds()),
			slog.Float64("outstanding_age_seconds", outstanding.Seconds()), slog.Bool("figures_capped", f.Capped),
			slog.String("delivery_lag_band", LagBand(pending)), slog.String("verification_lag_band", LagBand(unverified)),
			slog.String("set_aside_lag_band", LagBand(setAside)), slog.String("outstanding_band", LagBand(outstanding)))
	}
	if r.Figures == nil && r.Outcome == OutcomeFailed {
		// No figures: the bands say so, and the SLO counts the sample as
		// bad (its total includes BandUnknown, its good bands do not).
		attrs = append(attrs, slog.String("delivery_lag_band", BandUnknown), slog.String("verification_lag_band", BandUnknown),
			slog.String("set_aside_lag_band", BandUnknown), slog.String("outstanding_band", BandUnknown))
	}
	if r.Error != "" {
		attrs = append(attrs, slog.String("error", r.Error), slog.String("cause", cmp.Or(r.Cause, CauseInternal)))
	}
	s.log.LogAttrs(ctx, level, LogVerifyWorkspace, attrs...)
}

// RequeuedEvent is an event the verifier has sent back to pending again and
// again.
type RequeuedEvent struct {
	HistoryID string `json:"history_id"`
	EventID   string `json:"event_id"`
	// Times is how many times this verifier sent it back to pending.
	Times int `json:"times"`
}

// requeueCounts counts, per event, how many times this verifier sent an
// event back to pending. The schema keeps nothing that survives an event's
// requeue and acknowledgement, so the count lives with the verifier
// instance (one Cloud Run instance, kept warm by the schedule) and starts
// again when the instance does; the dead-letter subscription's copies of an
// event are the lasting count. It holds at most maxRequeueCounts events.
type requeueCounts struct {
	mu     sync.Mutex
	counts map[string]int // workspace/generation/history id → times
}

const maxRequeueCounts = 100_000

// countRequeues counts the events a round sent back to pending and returns
// those sent back more than RequeueReportAfter times, logging each.
func (s *Service) countRequeues(workspace string, t store.Target, requeued []string) []RequeuedEvent {
	if len(requeued) == 0 {
		return nil
	}
	var out []RequeuedEvent
	s.requeues.mu.Lock()
	if s.requeues.counts == nil || len(s.requeues.counts) > maxRequeueCounts {
		s.requeues.counts = map[string]int{}
	}
	for _, id := range requeued {
		key := workspace + "/" + t.Generation + "/" + id
		s.requeues.counts[key]++
		if n := s.requeues.counts[key]; n > s.cfg.RequeueReportAfter {
			out = append(out, RequeuedEvent{HistoryID: id, EventID: event.ID(t.SourceID, id, t.Generation), Times: n})
		}
	}
	s.requeues.mu.Unlock()
	for _, e := range out {
		s.log.Error("replication: an event sent back to pending again and again: it keeps not landing in BigQuery (see job dead-letter)",
			slog.String("workspace", workspace), slog.String("generation", t.Generation), slog.String("history_id", e.HistoryID),
			slog.String("event_id", e.EventID), slog.Int("times", e.Times))
	}
	return out
}
