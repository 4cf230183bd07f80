package main

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/registry"
)

// drains is how many drains of a workspace run at once: one per connection
// of its pool (the pages take one of them while they run).
func (e *env) drains(ws registry.Workspace) int {
	if ws.Database.MaxConns > 0 {
		return int(ws.Database.MaxConns)
	}
	return int(e.poolSize)
}

func (e *env) pagesOptions(ws registry.Workspace) delivery.PagesOptions {
	return delivery.PagesOptions{Generation: e.generation, Drains: e.drains(ws), Progress: e.progress, Restart: e.restart}
}

// pagesResult is a backfill's or replay's result as a command shows it.
type pagesResult struct{ delivery.PagesResult }

func (r pagesResult) text() []string {
	line := fmt.Sprintf("generation %s: %s, %s", r.Generation, count(r.Pages, "page"), count(int(r.Rows), "row"))
	if sel := r.Selection; sel != nil {
		line = fmt.Sprintf("generation %s: %s sent back to pending in %s (delivered before %s)", r.Generation, count(int(r.Rows), "event"), count(r.Pages, "page"),
			sel.AcceptedBefore.UTC().Format(time.RFC3339Nano))
	}
	if r.Resumed {
		line += " (resumed)"
	}
	lines := []string{line + "; " + drainResult{r.Drained}.text()[0]}
	if len(r.Unmatched) > 0 {
		lines = append(lines, fmt.Sprintf("no event of these records was selected: %s", strings.Join(r.Unmatched, ", ")))
	}
	return lines
}

// drainResult is a drain's result as a command shows it.
type drainResult struct{ delivery.DrainAllResult }

func (r drainResult) text() []string {
	line := "published " + count(r.Published, "event")
	if r.SetAside > 0 {
		line += fmt.Sprintf(", set aside %d (job set-aside lists them)", r.SetAside)
	}
	if r.Paused {
		line += ", stopped: replication is " + strings.ReplaceAll(r.State, "_", " ")
	}
	return []string{line}
}

func runBackfill(e *env) error {
	return e.eachWorkspace("backfill", func(ctx context.Context, ws registry.Workspace) (any, error) {
		res, err := e.svc.Backfill(ctx, ws.ID, e.pagesOptions(ws))
		return pagesResult{res}, err
	})
}

// selection is the partial replay the flags choose (none: the whole
// generation).
func (e *env) selection() delivery.ReplaySelection {
	return delivery.ReplaySelection{Entities: e.entities, SinceRevision: e.since, Records: e.records, AcceptedBefore: e.before}
}

func runReplay(e *env) error {
	return e.eachWorkspace("replay", func(ctx context.Context, ws registry.Workspace) (any, error) {
		if sel := e.selection(); sel.Partial() {
			res, err := e.svc.ReplayPartial(ctx, ws.ID, e.pagesOptions(ws), sel)
			return pagesResult{res}, err
		}
		res, err := e.svc.Replay(ctx, ws.ID, e.pagesOptions(ws))
		return pagesResult{res}, err
	})
}

func runDrain(e *env) error {
	return e.eachWorkspace("drain", func(ctx context.Context, ws registry.Workspace) (any, error) {
		res, err := e.svc.DrainAll(ctx, ws.ID, delivery.DrainAllOptions{Drains: e.drains(ws), Progress: e.progress})
		if err == nil && res.Paused {
			e.log.WarnContext(ctx, "replication: drain stopped: replication is paused or has no active target; the next run carries on",
				"workspace", ws.ID, "state", res.State)
		}
		return drainResult{res}, err
	})
}

func runVerify(e *env) error {
	names := make([]string, len(e.workspaces))
	for i, ws := range e.workspaces {
		names[i] = ws.ID
	}
	pass := e.svc.VerifyAll(e.ctx, delivery.VerifyAllOptions{Workspaces: names, Budget: e.budget, SweepBatches: delivery.DefaultSweepBatches, Workers: e.parallel})
	out := make([]delivery.WorkspaceResult, len(pass.Workspaces))
	for i, r := range pass.Workspaces {
		out[i] = delivery.WorkspaceResult{Workspace: r.Workspace, Detail: verifyResult{r}}
		switch r.Outcome {
		case delivery.OutcomeFailed:
			out[i].Err = fmt.Errorf("%s", r.Error)
		case delivery.OutcomeNotReached:
			out[i].Err = fmt.Errorf("not reached within the --budget of %v: run verify again, or with a longer budget", e.budget)
		}
	}
	e.log.Info("replication verify pass", "workspaces", len(pass.Workspaces), "lookups", pass.Lookups, "shared_lookups", pass.SharedLookups,
		"not_reached", len(pass.NotReached))
	return e.summarise("verify", out)
}

func runViews(e *env) error {
	return e.eachWorkspace("views", func(ctx context.Context, ws registry.Workspace) (any, error) {
		names, err := e.svc.CreateViews(ctx, ws.ID)
		return viewNames(names), err
	})
}

// verifyResult is a verifier pass's result for a workspace, as a command
// shows it.
type verifyResult struct{ delivery.VerifyResult }

func (r verifyResult) text() []string {
	return []string{fmt.Sprintf("%s: %d rounds: %d checked, %d verified, %d absent (%d sent back to pending), %d swept",
		r.Outcome, r.Rounds, r.Checked, r.Verified, r.Retried, r.Requeued, r.Swept)}
}

// viewNames are the views a command created, one line each.
type viewNames []string

func (v viewNames) text() []string { return v }

// setAsideResult is one workspace's set-aside events, and how many a
// --retry made claimable again, as a command shows them.
type setAsideResult struct{ delivery.SetAsideResult }

func (r setAsideResult) text() []string {
	lines := []string{fmt.Sprintf("generation %s: %d events set aside", r.Generation, r.SetAside.Count)}
	if r.SetAside.NotShared {
		lines = []string{fmt.Sprintf("generation %s: set-aside events unknown here: %s", r.Generation, r.SetAside.Note)}
	}
	for _, ev := range r.SetAside.Events {
		lines = append(lines, fmt.Sprintf("  %s  event %s  %s  %s  since %s, next attempt %s, attempts %d", ev.HistoryID, ev.EventID,
			cmp.Or(ev.HistoryTable, "(baseline)"), ev.Reason, ev.Since.UTC().Format(time.RFC3339), ev.NextAttempt.UTC().Format(time.RFC3339), ev.Attempts))
		if ev.Detail != "" {
			lines = append(lines, "    "+ev.Detail)
		}
	}
	if r.Retried > 0 {
		lines = append(lines, fmt.Sprintf("retried: %s will be tried by the next drain", count(int(r.Retried), "event")))
	}
	return lines
}

func runSetAside(e *env) error {
	return e.eachWorkspace("set-aside", func(ctx context.Context, ws registry.Workspace) (any, error) {
		res, err := e.svc.SetAsideEvents(ctx, ws.ID, 1000, e.retry)
		return setAsideResult{res}, err
	})
}

// deadLetterResult is a workspace's dead letters, as a command shows them.
type deadLetterResult struct{ delivery.DeadLetterReport }

func (r deadLetterResult) text() []string {
	more := ""
	if !r.Complete {
		more = " (more may remain: --max or the time bound stopped the reading)"
	}
	lines := []string{fmt.Sprintf("%s: %s, %s%s", r.Subscription, count(r.Messages, "message"), count(len(r.Events), "event"), more)}
	for _, ev := range r.Events {
		lines = append(lines, fmt.Sprintf("  event %s  %s %s  %s, %s, dead-lettered %s to %s", ev.EventID,
			cmp.Or(ev.Entity, ev.EntityID, "-"), cmp.Or(ev.RecordKey, "-"), count(ev.Copies, "copy"), count(ev.DeliveryAttempts, "delivery attempt"),
			ev.FirstDeadLettered.UTC().Format(time.RFC3339), ev.LastDeadLettered.UTC().Format(time.RFC3339)))
	}
	if r.Republished > 0 {
		lines = append(lines, fmt.Sprintf("republished %s to the events topic", count(r.Republished, "message")))
	}
	if r.Discarded > 0 {
		lines = append(lines, fmt.Sprintf("discarded %s (each event is in the log: %q)", count(r.Discarded, "message"), delivery.LogDeadLetterDiscarded))
	}
	if len(r.NotFound) > 0 {
		lines = append(lines, "not among the messages read: "+strings.Join(r.NotFound, ", "))
	}
	return lines
}

func runDeadLetter(e *env) error {
	return e.eachWorkspace("dead-letter", func(ctx context.Context, ws registry.Workspace) (any, error) {
		res, err := e.svc.DeadLetters(ctx, ws.ID, delivery.DeadLetterOptions{Max: e.max, Republish: e.republish, Discard: e.discard, Events: e.events})
		return deadLetterResult{res}, err
	})
}

// count says n things, in the singular for one.
func count(n int, thing string) string {
	switch {
	case n == 1:
		return "1 " + thing
	case strings.HasSuffix(thing, "y"):
		return fmt.Sprintf("%d %sies", n, strings.TrimSuffix(thing, "y"))
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
