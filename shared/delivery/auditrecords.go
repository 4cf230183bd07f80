package delivery

import (
	"context"
	"slices"
	"time"

	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// compareRecords reads the records of the differing buckets (of those
// keys only, when keys is not nil) from both sides and judges each. The
// source's latest states were read into the audit's session after the
// watermark's fence, so they hold every event up to the watermark; the
// database's clock is read before the warehouse's records, so that an
// event verified before then is one the warehouse read can see, and the
// source's records are read last, with when each latest event was
// verified as of then.
func (s *Service) compareRecords(ctx context.Context, ws registry.Workspace, src *store.AuditSource, q warehouse.AuditQuery,
	differing map[bucketKey]bool, keys []string, byView map[viewKey]*ViewAudit, rep *AuditReport) error {
	readAt, sourceState, warehouseState, err := s.readDiffering(ctx, ws, src, q, differing, keys)
	if err != nil {
		return err
	}
	seen := map[recordKey]bool{}
	judgeOne := func(k recordKey) {
		if seen[k] {
			return
		}
		seen[k] = true
		v := byView[k.viewKey]
		if v == nil || !differing[bucketKey{k.viewKey, bucketOf(k.key, q.Digits)}] {
			return
		}
		src, inSource := sourceState[k]
		dst, inWarehouse := warehouseState[k]
		var sp *store.AuditRecord
		var wp *warehouse.AuditRecord
		if inSource {
			sp = &src
		}
		if inWarehouse {
			wp = &dst
		}
		kind, inFlight := judge(sp, wp, readAt)
		if inFlight {
			v.InFlight++
			rep.InFlight++
			return
		}
		if kind == "" {
			return
		}
		d := Difference{RecordKey: k.key, Kind: kind}
		if sp != nil {
			d.SourceRevision, d.SourceDeleted = &sp.Revision, sp.Deleted
		}
		if wp != nil {
			d.WarehouseRevision, d.WarehouseDeleted = &wp.Revision, wp.Deleted
		}
		if v.Counts == nil {
			v.Counts = map[string]int64{}
		}
		v.Counts[kind]++
		v.Differences = append(v.Differences, d)
		rep.Differences++
		if repairable(kind) {
			rep.Repairable++
			rep.repair = append(rep.repair, sp.HistoryID)
		}
	}
	for k := range sourceState {
		judgeOne(k)
	}
	for k := range warehouseState {
		judgeOne(k)
	}
	return nil
}

// readDiffering reads, for the buckets that differ, the database's clock
// (readAt), then the warehouse's records and the source's, each by
// record.
func (s *Service) readDiffering(ctx context.Context, ws registry.Workspace, src *store.AuditSource, q warehouse.AuditQuery,
	differing map[bucketKey]bool, keys []string) (time.Time, map[recordKey]store.AuditRecord, map[recordKey]warehouse.AuditRecord, error) {
	prefixes := map[string][]string{} // entity → its differing buckets
	var all []string
	for k := range differing {
		if !slices.Contains(prefixes[k.entity], k.bucket) {
			prefixes[k.entity] = append(prefixes[k.entity], k.bucket)
		}
		if !slices.Contains(all, k.bucket) {
			all = append(all, k.bucket)
		}
	}
	slices.Sort(all)
	readAt, err := src.Now(ctx)
	if err != nil {
		return time.Time{}, nil, nil, err
	}
	target, err := s.cfg.Auditor.AuditRecords(ctx, ws.BigQuery, q, all, keys)
	if err != nil {
		return time.Time{}, nil, nil, err
	}
	warehouseState := map[recordKey]warehouse.AuditRecord{}
	for _, r := range target {
		warehouseState[recordKey{viewKey{r.EntityID, r.Kind}, r.Key}] = r
	}
	sourceState := map[recordKey]store.AuditRecord{}
	for entity, p := range prefixes {
		slices.Sort(p)
		records, err := src.Records(ctx, entity, p, keys)
		if err != nil {
			return time.Time{}, nil, nil, err
		}
		for _, r := range records {
			sourceState[recordKey{viewKey{r.EntityID, r.Kind}, r.Key}] = r
		}
	}
	return readAt, sourceState, warehouseState, nil
}

// judge compares a record's latest state at the source (nil: no event of
// it up to the watermark) with the warehouse's (nil: no row of it), as the
// views show them: a tombstone shows nothing. It returns the difference's
// kind ("" when the views agree), or inFlight when the source's latest
// event is not yet verified, or was verified at or after verifiedBefore
// (when the warehouse was read): the drain and the verifier are on it.
func judge(src *store.AuditRecord, dst *warehouse.AuditRecord, verifiedBefore time.Time) (kind string, inFlight bool) {
	if src != nil && dst != nil && src.Revision == dst.Revision && src.Deleted == dst.Deleted {
		return "", false
	}
	if src == nil {
		if dst.Deleted {
			return "", false // a tombstone of a record the source does not know: no view shows it
		}
		return DifferenceAbsent, false
	}
	if src.VerifiedAt == nil || !src.VerifiedAt.Before(verifiedBefore) {
		return "", true
	}
	switch {
	case dst == nil && src.Deleted:
		return "", false // deleted at the source, never shown by the warehouse
	case dst == nil:
		return DifferenceMissing, false
	case dst.Revision > src.Revision:
		if dst.Deleted && src.Deleted {
			return "", false
		}
		return DifferenceNewer, false
	case src.Deleted && dst.Deleted:
		return "", false // both show nothing
	case src.Deleted:
		return DifferenceDeleted, false
	case dst.Deleted:
		return DifferenceMissing, false
	}
	return DifferenceStale, false
}

// recheck waits, then judges again the records whose differences the audit
// found, from a new read of the source (the same watermark, in the
// session's pages) and of the warehouse (those records only), and keeps
// in rep only the differences it confirms: a difference the second look
// does not see is never reported.
func (s *Service) recheck(ctx context.Context, ws registry.Workspace, st *store.Store, t store.Target, q warehouse.AuditQuery,
	byView map[viewKey]*ViewAudit, rep *AuditReport, after time.Duration) error {
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(after):
	}
	differing := map[bucketKey]bool{}
	var keys, entities []string
	for k, v := range byView {
		for _, d := range v.Differences {
			differing[bucketKey{k, bucketOf(d.RecordKey, q.Digits)}] = true
			if !slices.Contains(keys, d.RecordKey) {
				keys = append(keys, d.RecordKey)
			}
			if !slices.Contains(entities, k.entity) {
				entities = append(entities, k.entity)
			}
		}
		v.Counts, v.Differences = nil, nil
	}
	rep.Rechecked = rep.Differences
	rep.Differences, rep.Repairable, rep.repair = 0, 0, nil
	slices.Sort(entities)
	src, err := st.OpenAudit(ctx, t, q.Watermark, entities)
	if err != nil {
		return err
	}
	defer src.Close(ctx)
	return s.compareRecords(ctx, ws, src, q, differing, keys, byView, rep)
}
