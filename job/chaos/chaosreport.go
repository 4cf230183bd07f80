package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
)

// proof is one promise, checked.
type proof struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// chaosReport is what a chaos run did and proved.
type chaosReport struct {
	Seed                 uint64  `json:"seed"`
	DurationSeconds      float64 `json:"duration_seconds"`
	RateCommitsPerSecond float64 `json:"rate_commits_per_second"`
	// CommitsPerSecond is the rate achieved over the run (the SDK pauses
	// between bursts, and waits for its wake-ups' answers).
	CommitsPerSecond float64 `json:"commits_per_second"`
	Drains           int     `json:"drains"`
	Commits          int64   `json:"commits"`
	// CommitsFailed are SDK commits that failed (a restart, a migration):
	// actions the SDK reports failed, with nothing to deliver.
	CommitsFailed int64            `json:"commits_failed"`
	Changes       map[string]int64 `json:"changes"`
	Events        int64            `json:"events"`
	Verified      int64            `json:"verified"`
	Pending       int64            `json:"pending"`
	SetAside      int64            `json:"set_aside"`
	FullyVerified bool             `json:"fully_verified"`
	// VerifiedAfterFaultsSecs is the time from the faults' end (and the
	// operations') to full verification.
	VerifiedAfterFaultsSecs float64 `json:"verified_after_faults_seconds"`
	Published               int     `json:"published_messages"`
	Landed                  int64   `json:"landed_rows"`
	// Duplicates are the messages beyond one per event, attributed: the
	// replays sent again, on purpose, the events they found published
	// before they started; the rest the faults caused (a lost answer, a
	// publish cut by a stop or a reset, a verifier's retry).
	Duplicates        int            `json:"duplicates"`
	DuplicatesReplays int            `json:"duplicates_by_replays"`
	DuplicatesFaults  int            `json:"duplicates_by_faults"`
	Faults            map[string]int `json:"faults"`
	// FaultsEffective counts, by kind, the faults that met something
	// (Effect > 0): only they count towards "every kind".
	FaultsEffective map[string]int `json:"faults_effective"`
	WakeUps         map[string]int `json:"wake_ups"`
	// Answers is how long the SDK waited for them.
	Answers sandbox.AnswerSummary `json:"answers"`
	// Path is how events reached Pub/Sub first, and the promise's checks.
	Path    pathSummary    `json:"path"`
	Promise promiseSummary `json:"promise"`
	// ClaimRaces is the claim race's count (see claimRace).
	ClaimRaces claimRaceSummary `json:"claim_races"`
	// SetAsideDuringRun is the most events set aside at once during the
	// faults.
	SetAsideDuringRun  int                   `json:"set_aside_during_run"`
	PassesFailed       int64                 `json:"verifier_passes_failed"`
	LiveChecks         int                   `json:"live_checks"`
	Timeline           []timelineEntry       `json:"timeline"`
	Views              []sandbox.ViewCheck   `json:"views"`
	Audit              *delivery.AuditReport `json:"audit"`
	Proofs             []proof               `json:"proofs"`
	operationsFailures []string
}

// opErrs records an operation's failure.
func (c *chaosRun) opErrs(kind string, err error) {
	if err == nil {
		return
	}
	c.replayMu.Lock()
	defer c.replayMu.Unlock()
	c.report.operationsFailures = append(c.report.operationsFailures, kind+": "+err.Error())
}

// pathSummary is how the events reached Pub/Sub first, and how long the
// promised ones took.
type pathSummary struct {
	ByWakeUps    int `json:"by_wake_ups"`
	ByOperations int `json:"by_operations"`
	BySweep      int `json:"by_sweep"`
	// SweptRacing are promised commits the sweep published first while a
	// drain that may have carried them was in flight (see pathReport).
	SweptRacing int     `json:"swept_racing_a_drain"`
	LagMaxSecs  float64 `json:"delivery_lag_max_seconds"`
	LagP99Secs  float64 `json:"delivery_lag_p99_seconds"`
}

// promiseSummary is the live checks of a wake-up's promise.
type promiseSummary struct {
	Pauses   int `json:"pauses_checked"`
	Promised int `json:"promised_delivered"`
	Stranded int `json:"stranded"`
	Excused  int `json:"excused"`
	// Examples are the first stranded commits, with when (seconds into
	// the run) their wake-up was answered and they were found pending.
	Examples []strandedExample `json:"stranded_examples,omitempty"`
}

// claimRaceSummary is what the claim race did: the wake-ups sent while
// the claim before them was held, those answered 2xx before it was let go,
// the held publishes it lost, and the pauses it could not use, by reason.
type claimRaceSummary struct {
	Sent           int            `json:"sent"`
	AnsweredAtOnce int            `json:"answered_2xx_while_held"`
	Lost           int            `json:"held_publishes_lost"`
	Skipped        map[string]int `json:"pauses_skipped,omitempty"`
}

func (s claimRaceSummary) String() string {
	skipped := "none"
	if len(s.Skipped) > 0 {
		skipped = counts(s.Skipped)
	}
	return fmt.Sprintf("%d wake-ups sent while the claim before them was held in Pub/Sub, %d of them answered 2xx before it was let go, %d held publishes lost; pauses skipped: %s",
		s.Sent, s.AnsweredAtOnce, s.Lost, skipped)
}

// strandedExample is one stranded commit in the report.
type strandedExample struct {
	EventID         string  `json:"event_id"`
	Drain           int     `json:"drain"`
	AnsweredSeconds float64 `json:"answered_at_seconds"`
	FoundSeconds    float64 `json:"found_at_seconds"`
}

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
	fmt.Fprintf(tw, "wake-ups\t%s (as the SDK saw them within 5 s); answered in p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
		counts(r.WakeUps), r.Answers.P50Ms, r.Answers.P99Ms, r.Answers.MaxMs)
	fmt.Fprintf(tw, "path\tpublished first by the wake-ups' drains %d, operations %d, the sweep %d (once a minute; %d promised, racing a drain in flight); delivery lag of promised commits max %.1fs, p99 %.1fs\n",
		r.Path.ByWakeUps, r.Path.ByOperations, r.Path.BySweep, r.Path.SweptRacing, r.Path.LagMaxSecs, r.Path.LagP99Secs)
	fmt.Fprintf(tw, "promise\t%d wake-ups answered 2xx, checked at %d pauses with no drain in flight: %d stranded, %d excused by the drain's own faults\n",
		r.Promise.Promised+r.Promise.Stranded, r.Promise.Pauses, r.Promise.Stranded, r.Promise.Excused)
	fmt.Fprintf(tw, "claim race\t%s\n", r.ClaimRaces)
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
	return errors.New("chaos: broken: " + strings.Join(broken, "; "))
}
