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
	fmt.Fprintf(tw, "chaos\t%.0fs of faults at %.0f commits/s, seed %d (--seed %[3]d repeats the schedule)\n", r.DurationSeconds, r.RateCommitsPerSecond, r.Seed)
	changes := []string{}
	for _, k := range []string{"create", "update", "delete", "link", "unlink"} {
		changes = append(changes, fmt.Sprintf("%d %ss", r.Changes[k], k))
	}
	fmt.Fprintf(tw, "written\t%d commits: %s\n", r.Commits, strings.Join(changes, ", "))
	fmt.Fprintf(tw, "events\t%d captured; %d messages published; %d rows landed\n", r.Events, r.Published, r.Landed)
	fmt.Fprintf(tw, "faults\t%s\n", counts(r.Faults))
	fmt.Fprintf(tw, "wake-ups\t%s\n", counts(r.WakeUps))
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
