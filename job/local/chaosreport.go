package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// print writes the report: a table, or JSON with the timeline.
func (r *chaosReport) print(w io.Writer, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "chaos\t%.0fs of faults at %.0f commits/s while the SDK is busy (%.1f/s achieved), %d drain instances, seed %d (--seed %[5]d repeats the schedule)\n",
		r.DurationSeconds, r.RateCommitsPerSecond, r.CommitsPerSecond, r.Drains, r.Seed)
	changes := []string{}
	for _, k := range []string{"create", "update", "delete", "link", "unlink"} {
		changes = append(changes, fmt.Sprintf("%d %ss", r.Changes[k], k))
	}
	fmt.Fprintf(tw, "written\t%d commits: %s; %d commits failed (the server restarting, a migration)\n", r.Commits, strings.Join(changes, ", "), r.CommitsFailed)
	fmt.Fprintf(tw, "events\t%d captured; %d messages published; %d rows landed\n", r.Events, r.Published, r.Landed)
	fmt.Fprintf(tw, "faults\t%s (took effect / injected)\n", effective(r.Faults, r.FaultsEffective))
	fmt.Fprintf(tw, "wake-ups\t%s (as the SDK saw them within 5 s)\n", counts(r.WakeUps))
	fmt.Fprintf(tw, "path\tpublished first by the wake-ups' drains %d, operations %d, the sweep %d (once a minute); delivery lag of promised commits max %.1fs, p99 %.1fs\n",
		r.Path.ByWakeUps, r.Path.ByOperations, r.Path.BySweep, r.Path.LagMaxSecs, r.Path.LagP99Secs)
	fmt.Fprintf(tw, "promise\t%d wake-ups answered 2xx, checked at %d pauses with no drain in flight: %d stranded, %d excused by the drain's own faults\n",
		r.Promise.Promised+r.Promise.Stranded, r.Promise.Pauses, r.Promise.Stranded, r.Promise.Excused)
	fmt.Fprintf(tw, "set aside\tat most %d events at once during the faults; %d verifier passes failed\n", r.SetAsideDuringRun, r.PassesFailed)
	fmt.Fprintf(tw, "duplicates\t%d: %d by the replays, %d by the faults (absorbed by the views)\n", r.Duplicates, r.DuplicatesReplays, r.DuplicatesFaults)
	fmt.Fprintf(tw, "verified\t%.1fs after the faults and operations ended\n", r.VerifiedAfterFaultsSecs)
	for _, p := range r.Proofs {
		mark := "ok"
		if !p.OK {
			mark = "FAILED"
		}
		fmt.Fprintf(tw, "proof %s\t%s: %s\n", mark, p.Name, p.Detail)
	}
	return tw.Flush()
}

// counts lists a count per key, keys in order.
func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// effective lists, for each kind, the faults that took effect of those
// injected.
func effective(injected, took map[string]int) string {
	keys := make([]string, 0, len(injected))
	for k := range injected {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d/%d", k, took[k], injected[k])
	}
	return strings.Join(parts, ", ")
}

// failure names every broken proof (nil when all hold).
func (r *chaosReport) failure() error {
	var broken []string
	for _, p := range r.Proofs {
		if !p.OK {
			broken = append(broken, p.Name+" ("+p.Detail+")")
		}
	}
	if len(broken) == 0 {
		return nil
	}
	return errors.New("local: chaos: broken: " + strings.Join(broken, "; "))
}
