package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/registry"
)

// auditResult is a workspace's audit as `job audit` shows it.
type auditResult struct{ delivery.AuditReport }

func (r auditResult) text() []string {
	verdict := "equal"
	if !r.Equal {
		verdict = fmt.Sprintf("DIFFERS: %d differences (%d repairable by `job repair`)", r.Differences, r.Repairable)
	}
	lines := []string{fmt.Sprintf("generation %s as of revision %d: %s; %d buckets compared, %d differ; %d records in flight (not judged)",
		r.Generation, r.Watermark, verdict, r.Buckets, r.DifferingBuckets, r.InFlight)}
	for _, v := range r.Views {
		line := fmt.Sprintf("  %-24s source %d, warehouse %d", v.View, v.SourceRecords, v.WarehouseRecords)
		if len(v.Counts) > 0 {
			var parts []string
			for _, kind := range []string{delivery.DifferenceMissing, delivery.DifferenceStale, delivery.DifferenceDeleted,
				delivery.DifferenceAbsent, delivery.DifferenceNewer} {
				if n := v.Counts[kind]; n > 0 {
					parts = append(parts, fmt.Sprintf("%d %s", n, strings.ReplaceAll(kind, "_", " ")))
				}
			}
			line += ": " + strings.Join(parts, ", ")
		}
		lines = append(lines, line)
		for _, d := range v.Differences {
			lines = append(lines, fmt.Sprintf("    %-18s %s  source %s, warehouse %s", d.Kind, d.RecordKey,
				revision(d.SourceRevision, d.SourceDeleted), revision(d.WarehouseRevision, d.WarehouseDeleted)))
		}
		if !v.AllListed {
			lines = append(lines, "    … more not listed (--json lists as many, --records narrows)")
		}
	}
	return lines
}

// revision shows one side's latest state of a record.
func revision(rev *int64, deleted bool) string {
	switch {
	case rev == nil:
		return "none"
	case deleted:
		return fmt.Sprintf("revision %d (deleted)", *rev)
	}
	return fmt.Sprintf("revision %d", *rev)
}

// errDiffers is `job audit`'s error when a warehouse differs from its
// source: the job exits 1.
var errDiffers = errors.New("the warehouse differs from the source")

// errNotAudited is `job audit`'s error when no warehouse was found to
// differ but some workspace could not be audited: the job exits 3.
type errNotAudited struct{ error }

// ExitCode implements exitCoder.
func (errNotAudited) ExitCode() int { return 3 }

func (e *env) auditOptions() delivery.AuditOptions {
	return delivery.AuditOptions{Entities: e.entities, Records: e.records, MaxListed: 100, RecheckAfter: e.recheck}
}

func runAudit(e *env) error {
	results := e.svc.ForEach(e.ctx, e.workspaces, e.parallel, func(ctx context.Context, ws registry.Workspace) (any, error) {
		rep, err := e.svc.Audit(ctx, ws.ID, e.auditOptions())
		delivery.LogAuditResult(ctx, e.log, ws.ID, rep, err)
		return auditResult{rep}, err
	})
	var differs []string
	for _, r := range results {
		if a, ok := r.Detail.(auditResult); ok && r.Err == nil && !a.Equal {
			differs = append(differs, r.Workspace)
		}
	}
	err := e.summarise("audit", results)
	switch {
	case len(differs) > 0:
		return fmt.Errorf("%w in %d of %d workspaces: %s (job repair re-delivers what it can)", errDiffers, len(differs), len(results),
			strings.Join(first(differs, 10), ", "))
	case err != nil:
		return errNotAudited{err}
	}
	return nil
}

// repairResult is a workspace's repair as `job repair` shows it.
type repairResult struct{ delivery.RepairReport }

func (r repairResult) text() []string {
	a := r.Audit
	lines := []string{fmt.Sprintf("generation %s as of revision %d: %s, %d repairable; %s sent back to pending (%d had been verified); %s",
		a.Generation, a.Watermark, count(int(a.Differences), "difference"), a.Repairable, count(r.Reset, "event"), r.Verified, drainResult{r.Drain}.text()[0])}
	if left := a.Differences - a.Repairable; left > 0 {
		lines = append(lines, fmt.Sprintf("%d differences are the warehouse's own records (absent at the source or newer): reported, never deleted; `job audit` lists them", left))
	}
	if r.Reset > 0 {
		lines = append(lines, "the verifier confirms them on its next pass (or run `job verify`); `job audit` then shows the result")
	}
	return lines
}

func runRepair(e *env) error {
	return e.eachWorkspace("repair", func(ctx context.Context, ws registry.Workspace) (any, error) {
		rep, err := e.svc.Repair(ctx, ws.ID, delivery.RepairOptions{AuditOptions: e.auditOptions(),
			Drain: delivery.DrainAllOptions{Drains: e.drains(ws), Progress: e.progress}})
		return repairResult{rep}, err
	})
}
