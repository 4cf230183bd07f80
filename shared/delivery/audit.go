package delivery

import (
	"cmp"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// Audit and repair: does the warehouse's latest state of every record equal
// the source's, and, where it does not, re-deliver what makes it equal.
//
// An audit of a workspace's active target fixes a watermark (the revision
// counter's value) and judges the latest state of every record as of it on
// both sides. It compares buckets of records first, each side computing
// counts and checksums in its own SQL (store.AuditSource.Buckets,
// warehouse.AuditBuckets), and fetches records only for the buckets that
// differ. A record whose latest event at the source is not yet verified, or
// was verified after the warehouse's records were read, is in flight: the
// drain and the verifier are on it, and the audit does not judge it.
// Everything else that differs is a difference: missing from the
// warehouse, stale there, deleted at the source but shown there, or shown
// there and unknown at the source.

// Auditor reads the warehouse's side of an audit. *warehouse.BigQuery is the
// implementation.
type Auditor interface {
	AuditBuckets(ctx context.Context, table registry.BigQuery, q warehouse.AuditQuery) ([]warehouse.AuditBucket, error)
	AuditRecords(ctx context.Context, table registry.BigQuery, q warehouse.AuditQuery, buckets, keys []string) ([]warehouse.AuditRecord, error)
}

// Kinds of difference an audit reports.
const (
	// DifferenceMissing: the source has the record and the warehouse's
	// view does not show it (no row of it there, or a tombstone older than
	// the source's latest state).
	DifferenceMissing = "missing"
	// DifferenceStale: the warehouse shows an older state of the record
	// than the source's latest.
	DifferenceStale = "stale"
	// DifferenceDeleted: the record is deleted at the source and the
	// warehouse still shows it (its tombstone did not land or was lost).
	DifferenceDeleted = "deleted_at_source"
	// DifferenceAbsent: the warehouse shows a record the source has no
	// event of (never had, or its history is gone). Repair never deletes
	// warehouse data: it is reported only.
	DifferenceAbsent = "absent_at_source"
	// DifferenceNewer: the warehouse's latest state of the record is of a
	// revision the source does not have. Reported only.
	DifferenceNewer = "newer_than_source"
)

// repairable reports whether re-delivering the source's latest event of
// the record mends a difference of this kind.
func repairable(kind string) bool {
	return kind == DifferenceMissing || kind == DifferenceStale || kind == DifferenceDeleted
}

// DefaultAuditRecheck is `job audit`'s and `job repair`'s
// AuditOptions.RecheckAfter: the verifier's 30 seconds between two looks
// for an event.
const DefaultAuditRecheck = 30 * time.Second

// AuditOptions chooses what an audit compares.
type AuditOptions struct {
	// Entities are the entity names to audit (their relationships
	// included); empty: every entity of the target's selection.
	Entities []string
	// Records are record keys: only these are compared (their buckets
	// are not summed first).
	Records []string
	// MaxListed bounds the differences listed per view. Default: 100.
	MaxListed int
	// RecheckAfter, when not zero, is how long the audit waits before it
	// judges the differences it found again, from a new read of both sides
	// for those records only; only the differences the second judgement
	// confirms are reported (a record then in flight is counted in flight).
	RecheckAfter time.Duration
}

// AuditReport is one workspace's audit.
type AuditReport struct {
	Generation string `json:"generation"`
	// Watermark is the revision the audit judged at: later events are not
	// part of it.
	Watermark int64 `json:"watermark_revision"`
	// Equal reports that no view differs.
	Equal bool `json:"equal"`
	// Differences counts the differences of every view; Repairable how
	// many of them a repair re-delivers; InFlight the records not judged
	// because their latest event is on its way.
	Differences int64 `json:"differences"`
	Repairable  int64 `json:"repairable"`
	InFlight    int64 `json:"in_flight"`
	// Rechecked counts the differences the first judgement found and the
	// recheck judged again (AuditOptions.RecheckAfter); Differences are
	// those it confirmed.
	Rechecked int64 `json:"rechecked"`
	// Buckets and DifferingBuckets count the buckets compared; Digits is
	// how many hex digits of md5(record_key) made a bucket.
	Buckets          int `json:"buckets"`
	DifferingBuckets int `json:"differing_buckets"`
	Digits           int `json:"bucket_digits"`
	// Views are the audited views, in the target's order.
	Views []ViewAudit `json:"views"`

	// repair are the history ids of the source's latest events of the
	// repairable differences (all of them, not only those listed).
	repair []string
}

// ViewAudit is the audit of one latest-state view: an entity's records or
// one relationship's edges.
type ViewAudit struct {
	View       string `json:"view"`
	EntityID   string `json:"entity_id"`
	RecordKind string `json:"record_kind"`
	// SourceRecords and WarehouseRecords count the records with a latest
	// state up to the watermark on each side (tombstones included).
	SourceRecords    int64 `json:"source_records"`
	WarehouseRecords int64 `json:"warehouse_records"`
	DifferingBuckets int   `json:"differing_buckets"`
	InFlight         int64 `json:"in_flight"`
	// Counts counts the differences by kind.
	Counts map[string]int64 `json:"counts,omitempty"`
	// Differences lists them (up to MaxListed), by record key.
	Differences []Difference `json:"differences,omitempty"`
	// AllListed is false when more differences were found than listed.
	AllListed bool `json:"all_listed"`
}

// Difference is one record whose state differs.
type Difference struct {
	RecordKey string `json:"record_key"`
	Kind      string `json:"kind"`
	// SourceRevision and WarehouseRevision are the latest revision on each
	// side (nil: none there); the Deleted flags say whether it is a
	// tombstone.
	SourceRevision    *int64 `json:"source_revision,omitempty"`
	SourceDeleted     bool   `json:"source_deleted,omitempty"`
	WarehouseRevision *int64 `json:"warehouse_revision,omitempty"`
	WarehouseDeleted  bool   `json:"warehouse_deleted,omitempty"`
}

// LogAudit is the message of an audit's line per workspace (LogAuditResult),
// which terraform's log-based metric replication/audit_results counts.
const LogAudit = "replication audit"

// LogAuditResult writes a workspace's audit line: outcome equal (INFO),
// differs (WARNING, with the counts) or failed (ERROR, with the cause), the
// generation and the watermark.
func LogAuditResult(ctx context.Context, log *slog.Logger, workspace string, rep AuditReport, err error) {
	attrs := []any{slog.String("workspace", workspace), slog.String("generation", rep.Generation), slog.Int64("watermark_revision", rep.Watermark)}
	switch {
	case err != nil:
		log.ErrorContext(ctx, LogAudit, append(attrs, slog.String("outcome", "failed"),
			slog.String("cause", strings.Join(strings.Fields(err.Error()), " ")))...)
	case !rep.Equal:
		log.WarnContext(ctx, LogAudit, append(attrs, slog.String("outcome", "differs"), slog.Int64("differences", rep.Differences),
			slog.Int64("repairable", rep.Repairable), slog.Int64("in_flight", rep.InFlight))...)
	default:
		log.InfoContext(ctx, LogAudit, append(attrs, slog.String("outcome", "equal"), slog.Int64("differences", 0),
			slog.Int64("repairable", 0), slog.Int64("in_flight", rep.InFlight))...)
	}
}

// ErrBackfillIncomplete: the target's backfill has not finished, so its
// events are not all in the delivery queue yet.
var ErrBackfillIncomplete = errors.New("the target's backfill is not complete: run `job backfill` first")

// bucketDigits is how many hex digits make a bucket for an audit of n
// records: about √n buckets, so that a clean audit moves about √n bucket
// figures and a differing bucket about √n records.
func bucketDigits(n int64) int {
	switch {
	case n <= 256:
		return 1
	case n <= 65_536:
		return 2
	default:
		return store.AuditBucketDigits
	}
}

// bucketOf is the bucket of a record key: the first digits hex digits of
// its MD5, as both sides' SQL computes it (md5(text) of the UTF-8 bytes).
func bucketOf(key string, digits int) string {
	sum := md5.Sum([]byte(key))
	return hex.EncodeToString(sum[:])[:digits]
}

type viewKey struct{ entity, kind string }

type bucketKey struct {
	viewKey
	bucket string
}

type recordKey struct {
	viewKey
	key string
}

// Audit compares the workspace's warehouse with its source, as of a
// watermark fixed when it starts. It holds the workspace's pool while it
// runs, and no transaction while the warehouse is asked.
func (s *Service) Audit(ctx context.Context, workspaceID string, opts AuditOptions) (AuditReport, error) {
	var rep AuditReport
	err := s.retrying(ctx, "audit", workspaceID, func() error {
		return s.onActiveTarget(ctx, workspaceID, func(ws registry.Workspace, st *store.Store, t store.Target) (err error) {
			rep, err = s.audit(ctx, ws, st, t, opts)
			return err
		})
	})
	return rep, err
}

func (s *Service) audit(ctx context.Context, ws registry.Workspace, st *store.Store, t store.Target, opts AuditOptions) (AuditReport, error) {
	rep := AuditReport{Generation: t.Generation}
	if s.cfg.Auditor == nil {
		return rep, errors.New("delivery: no warehouse configured for audits")
	}
	switch {
	case !t.BaselineComplete:
		return rep, store.ErrBaselineIncomplete
	case !t.BackfillComplete:
		return rep, ErrBackfillIncomplete
	}
	views, err := auditedViews(t, opts.Entities)
	if err != nil {
		return rep, err
	}
	entities, byView := indexViews(views)
	// What is read when: the watermark, fenced (every transaction that
	// could still commit an event at or below it has ended, see
	// store.AuditMark); the source's latest states up to it, in pages; the
	// buckets of both sides; then, for the buckets that differ, the
	// database's clock (readAt), the warehouse's records and the source's
	// records with when each latest event was verified (read now). An event
	// the warehouse holds was verified at or after it landed, so a record
	// whose latest event at the source was verified before readAt is judged
	// on both sides; any other is in flight.
	mark, err := st.AuditMark(ctx, t)
	if err != nil {
		return rep, err
	}
	rep.Watermark = mark.Revision
	src, err := st.OpenAudit(ctx, t, mark.Revision, entities)
	if err != nil {
		return rep, err
	}
	defer src.Close(ctx)
	q := warehouse.AuditQuery{Generation: t.Generation, SourceID: t.SourceID, EntityIDs: entities, Watermark: mark.Revision}

	// Which buckets to look into: those whose figures differ or, for
	// chosen records, theirs.
	differing := map[bucketKey]bool{}
	keys := opts.Records
	if keys != nil {
		q.Digits = store.AuditBucketDigits
		for _, v := range views {
			for _, k := range keys {
				differing[bucketKey{viewKey{v.EntityID, v.RecordKind}, bucketOf(k, q.Digits)}] = true
			}
		}
	} else if differing, err = s.compareBuckets(ctx, ws, src, &q, entities, byView, &rep); err != nil {
		return rep, err
	}
	rep.Digits = q.Digits
	if opts.Records == nil {
		rep.DifferingBuckets = len(differing)
		for k := range differing {
			byView[k.viewKey].DifferingBuckets++
		}
	}
	if len(differing) > 0 {
		if err := s.compareRecords(ctx, ws, src, q, differing, keys, byView, &rep); err != nil {
			return rep, err
		}
	}
	if rep.Differences > 0 && opts.RecheckAfter > 0 {
		src.Close(ctx) // its connection back to the pool while the recheck waits
		if err := s.recheck(ctx, ws, st, t, q, byView, &rep, opts.RecheckAfter); err != nil {
			return rep, err
		}
	}
	listDifferences(views, cmp.Or(opts.MaxListed, 100))
	rep.Views = views
	rep.Equal = rep.Differences == 0
	return rep, nil
}

// indexViews returns the audited views' entities, each once, and the views
// by entity and record kind.
func indexViews(views []ViewAudit) ([]string, map[viewKey]*ViewAudit) {
	var entities []string
	byView := map[viewKey]*ViewAudit{}
	for i := range views {
		v := &views[i]
		byView[viewKey{v.EntityID, v.RecordKind}] = v
		if !slices.Contains(entities, v.EntityID) {
			entities = append(entities, v.EntityID)
		}
	}
	return entities, byView
}

// listDifferences sorts each view's differences by record key and keeps
// the first listed of them.
func listDifferences(views []ViewAudit, listed int) {
	for i := range views {
		v := &views[i]
		slices.SortFunc(v.Differences, func(a, b Difference) int { return strings.Compare(a.RecordKey, b.RecordKey) })
		v.AllListed = len(v.Differences) <= listed
		v.Differences = v.Differences[:min(len(v.Differences), listed)]
	}
}

// compareBuckets sums both sides per bucket (the source's from the audit's
// session, the warehouse's in one query) and returns the buckets whose
// figures differ, setting q.Digits and the views' record counts.
func (s *Service) compareBuckets(ctx context.Context, ws registry.Workspace, src *store.AuditSource, q *warehouse.AuditQuery,
	entities []string, byView map[viewKey]*ViewAudit, rep *AuditReport) (map[bucketKey]bool, error) {
	var source []store.AuditBucket
	var total int64
	for _, id := range entities {
		b, err := src.Buckets(ctx, id)
		if err != nil {
			return nil, err
		}
		for _, x := range b {
			total += x.Records
		}
		source = append(source, b...)
	}
	q.Digits = bucketDigits(total)
	target, err := s.cfg.Auditor.AuditBuckets(ctx, ws.BigQuery, *q)
	if err != nil {
		return nil, err
	}
	type figures struct{ records, checksum int64 }
	sides := map[bucketKey][2]*figures{}
	for _, b := range store.MergeBuckets(source, q.Digits) {
		k := bucketKey{viewKey{b.EntityID, b.Kind}, b.Bucket}
		f := sides[k]
		f[0] = &figures{b.Records, b.Checksum}
		sides[k] = f
		if v := byView[k.viewKey]; v != nil {
			v.SourceRecords += b.Records
		}
	}
	for _, b := range target {
		k := bucketKey{viewKey{b.EntityID, b.Kind}, b.Bucket}
		if byView[k.viewKey] == nil {
			continue // a kind the target does not select: no view shows it
		}
		f := sides[k]
		f[1] = &figures{b.Records, b.Checksum}
		sides[k] = f
		byView[k.viewKey].WarehouseRecords += b.Records
	}
	differing := map[bucketKey]bool{}
	for k, f := range sides {
		if byView[k.viewKey] == nil {
			continue
		}
		rep.Buckets++
		if f[0] == nil || f[1] == nil || *f[0] != *f[1] {
			differing[k] = true
		}
	}
	return differing, nil
}

// auditedViews are the target's views an audit covers: every one, or those
// of the named entities (an entity's relationships with it).
func auditedViews(t store.Target, entities []string) ([]ViewAudit, error) {
	specs, err := warehouse.ViewSpecs(ViewsTarget(t))
	if err != nil {
		return nil, err
	}
	names := map[string]string{} // entity id → entity view name
	for _, s := range specs {
		if s.Kind == "entity" {
			names[s.EntityID] = s.Name
		}
	}
	var out []ViewAudit
	for _, s := range specs {
		if len(entities) > 0 && !slices.Contains(entities, names[s.EntityID]) {
			continue
		}
		out = append(out, ViewAudit{View: s.Name, EntityID: s.EntityID, RecordKind: s.Kind})
	}
	for _, e := range entities {
		found := false
		for _, n := range names {
			found = found || n == e
		}
		if !found {
			known := make([]string, 0, len(names))
			for _, n := range names {
				known = append(known, n)
			}
			slices.Sort(known)
			return nil, fmt.Errorf("%w: entity %q is not replicated by generation %s (it replicates %s)", ErrUnknownEntity, e, t.Generation, strings.Join(known, ", "))
		}
	}
	return out, nil
}

// ErrUnknownEntity: an entity named on the command line is not part of the
// target's selection.
var ErrUnknownEntity = errors.New("unknown entity")
