package delivery

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/segmentstream/ontology-replication/shared/deadletter"
	"github.com/segmentstream/ontology-replication/shared/store"
)

// TestWorkspaceLineBands: the verifier's line reports each lag in its
// band, and the outstanding band (the SLO's) is the largest of the three,
// whichever it is.
func TestWorkspaceLineBands(t *testing.T) {
	t.Parallel()
	now := time.Now()
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	for _, tc := range []struct {
		name                                       string
		f                                          store.Figures
		delivery, verification, aside, outstanding string
	}{
		{"all fresh", store.Figures{}, "under_1m", "under_1m", "under_1m", "under_1m"},
		{"delivery the largest", store.Figures{OldestPending: ago(20 * time.Minute), OldestUnverified: ago(2 * time.Minute)},
			"under_30m", "under_5m", "under_1m", "under_30m"},
		{"verification the largest (a BigQuery-side outage)", store.Figures{OldestPending: ago(30 * time.Second), OldestUnverified: ago(50 * time.Minute)},
			"under_1m", "under_1h", "under_1m", "under_1h"},
		{"set-aside the largest", store.Figures{OldestUnverified: ago(3 * time.Minute), SetAsideSince: ago(2 * time.Hour)},
			"under_1m", "under_5m", "over_1h", "over_1h"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			s := &Service{log: slog.New(slog.NewJSONHandler(&buf, nil))}
			f := tc.f
			s.logWorkspace(t.Context(), VerifyResult{Workspace: "w1", Outcome: OutcomeVerified, Figures: &f})
			var line map[string]any
			if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
				t.Fatal(err)
			}
			got := []any{line["delivery_lag_band"], line["verification_lag_band"], line["set_aside_lag_band"], line["outstanding_band"]}
			want := []any{tc.delivery, tc.verification, tc.aside, tc.outstanding}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("bands %v, want %v", got, want)
				}
			}
		})
	}
}

// TestDeadLettersOldest: the oldest dead letter is the one dead-lettered
// first, whatever the order the messages were read in; each event keeps
// its first and last time.
func TestDeadLettersOldest(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 3, 1, 0, 0, 0, time.UTC)
	msgs := []deadletter.Message{
		{MessageID: "m1", Data: []byte(`{"event_id":"a"}`), Published: t0.Add(5 * time.Minute)},
		{MessageID: "m2", Data: []byte(`{"event_id":"b"}`), Published: t0},
		{MessageID: "m3", Data: []byte(`{"event_id":"a"}`), Published: t0.Add(time.Minute)},
		{MessageID: "m4", Data: []byte(`{"event_id":"a"}`), Published: t0.Add(9 * time.Minute)},
	}
	var rep DeadLetterReport
	byEvent, order := groupDeadLetters(msgs, &rep)
	if rep.Oldest == nil || !rep.Oldest.Equal(t0) {
		t.Fatalf("oldest %v, want %v", rep.Oldest, t0)
	}
	a := byEvent["a"]
	if len(order) != 2 || order[0] != "a" || a.Copies != 3 || !a.FirstDeadLettered.Equal(t0.Add(time.Minute)) || !a.LastDeadLettered.Equal(t0.Add(9*time.Minute)) {
		t.Fatalf("event a: %+v (order %v)", a, order)
	}
}
