package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
)

// TestSessionCountsPerMinute: the rate between two reads, or since the
// statistics' reset when there is no earlier read; none without a span, or
// when the counters went back (a reset between the reads).
func TestSessionCountsPerMinute(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	now := store.SessionCounts{Database: 30, Server: 120, Since: t0, ReadAt: t0.Add(10 * time.Minute)}
	for _, tc := range []struct {
		name      string
		now, prev store.SessionCounts
		db, srv   float64
		ok        bool
	}{
		{"since the reset", now, store.SessionCounts{}, 3, 12, true},
		{"since the last read", now, store.SessionCounts{Database: 20, Server: 60, ReadAt: t0.Add(5 * time.Minute)}, 2, 12, true},
		{"no reset time, no earlier read", store.SessionCounts{Database: 30, Server: 120, ReadAt: t0}, store.SessionCounts{}, 0, 0, false},
		{"counters reset between the reads", now, store.SessionCounts{Database: 40, Server: 160, ReadAt: t0.Add(5 * time.Minute)}, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, srv, ok := tc.now.PerMinute(tc.prev)
			require.Equal(t, tc.ok, ok)
			require.InDelta(t, tc.db, db, 1e-9)
			require.InDelta(t, tc.srv, srv, 1e-9)
		})
	}
}
