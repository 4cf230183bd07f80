package delivery

import (
	"testing"
	"time"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// TestJudge covers every branch of judge: what the views show on each
// side, and whether the source's latest event is still on its way.
func TestJudge(t *testing.T) {
	t.Parallel()
	read := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC) // when the warehouse was read
	before, after := read.Add(-time.Minute), read.Add(time.Second)
	src := func(rev int64, deleted bool, verified *time.Time) *store.AuditRecord {
		return &store.AuditRecord{Key: "k", Revision: rev, Deleted: deleted, VerifiedAt: verified}
	}
	dst := func(rev int64, deleted bool) *warehouse.AuditRecord {
		return &warehouse.AuditRecord{Key: "k", Revision: rev, Deleted: deleted}
	}
	for _, tc := range []struct {
		name     string
		src      *store.AuditRecord
		dst      *warehouse.AuditRecord
		kind     string
		inFlight bool
	}{
		{"same state", src(5, false, &before), dst(5, false), "", false},
		{"same tombstone", src(5, true, &before), dst(5, true), "", false},
		{"same state, not verified yet", src(5, false, nil), dst(5, false), "", false},
		{"only the warehouse has it", nil, dst(3, false), DifferenceAbsent, false},
		{"only the warehouse has its tombstone", nil, dst(3, true), "", false},
		{"latest not verified", src(6, false, nil), dst(5, false), "", true},
		{"latest verified after the warehouse was read", src(6, false, &after), dst(5, false), "", true},
		{"latest verified as the warehouse was read", src(6, false, &read), nil, "", true},
		{"deleted at the source, never in the warehouse", src(6, true, &before), nil, "", false},
		{"missing from the warehouse", src(6, false, &before), nil, DifferenceMissing, false},
		{"warehouse newer than the source", src(5, false, &before), dst(7, false), DifferenceNewer, false},
		{"warehouse's newer state a tombstone, the source's too", src(5, true, &before), dst(7, true), "", false},
		{"warehouse newer, its state a tombstone", src(5, false, &before), dst(7, true), DifferenceNewer, false},
		{"both tombstones at different revisions", src(7, true, &before), dst(5, true), "", false},
		{"deleted at the source, shown by the warehouse", src(7, true, &before), dst(5, false), DifferenceDeleted, false},
		{"the warehouse's latest a tombstone the source has not", src(7, false, &before), dst(5, true), DifferenceMissing, false},
		{"an older state in the warehouse", src(7, false, &before), dst(5, false), DifferenceStale, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kind, inFlight := judge(tc.src, tc.dst, read)
			if kind != tc.kind || inFlight != tc.inFlight {
				t.Errorf("judge = %q, in flight %v; want %q, %v", kind, inFlight, tc.kind, tc.inFlight)
			}
		})
	}
}
