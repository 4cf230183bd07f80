package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
)

// summary is what a local run did and found.
type summary struct {
	// Database says how the components reached the database (--cloud-sql:
	// through the Cloud SQL connector).
	Database string `json:"database"`
	// databaseProblem fails the run: a component that did not reach the
	// database the way it was asked to.
	databaseProblem    string
	Commits            int            `json:"commits"`
	Changes            map[string]int `json:"changes"`
	EventsWritten      int64          `json:"events_written"`
	Published          int            `json:"published"`
	Landed             int64          `json:"landed"`
	DuplicatesAbsorbed int64          `json:"duplicates_absorbed"`
	Verified           int64          `json:"verified"`
	Pending            int64          `json:"pending"`
	Retried            int            `json:"retried"`
	Requeued           int            `json:"requeued"`
	Replayed           int            `json:"replayed"`
	OutageRefusals     int64          `json:"outage_refusals"`
	// OutagePublishes is how many publishes Pub/Sub refused in the outage.
	OutagePublishes    int64               `json:"outage_publishes_refused"`
	DeadLettered       int64               `json:"dead_lettered"`
	DeadLetterEvent    string              `json:"dead_letter_event"`
	DeadLetterVerified bool                `json:"dead_letter_verified"`
	FullyVerified      bool                `json:"fully_verified"`
	WorkloadSeconds    float64             `json:"workload_seconds"`
	VerifiedAfterSecs  float64             `json:"verified_after_last_commit_seconds"`
	Views              []sandbox.ViewCheck `json:"views"`
	// Audit is `job audit`'s audit of the local warehouse at the end.
	Audit *delivery.AuditReport `json:"audit"`
	// The largest lags seen during the run: how long the oldest event
	// waited to be published, and to be verified once accepted.
	MaxDeliveryLagSecs     float64 `json:"max_delivery_lag_seconds"`
	MaxVerificationLagSecs float64 `json:"max_verification_lag_seconds"`
}

func (s *summary) failure() error {
	var problems []string
	if s.databaseProblem != "" {
		problems = append(problems, s.databaseProblem)
	}
	if !s.FullyVerified {
		problems = append(problems, fmt.Sprintf("%d of %d events verified", s.Verified, s.EventsWritten))
	}
	if !s.DeadLetterVerified {
		problems = append(problems, "the dead-lettered event was not retried and verified")
	}
	for _, v := range s.Views {
		if !v.Match {
			problems = append(problems, fmt.Sprintf("view %s has %d rows where the source has %d, %d with other values (%s)", v.View, v.Rows, v.Source,
				v.Differing, v.Example))
		}
	}
	if s.Audit == nil || !s.Audit.Equal {
		problems = append(problems, "the audit found the warehouse different from the source")
	}
	if len(problems) > 0 {
		return errors.New("local: " + strings.Join(problems, "; "))
	}
	return nil
}

func (s *summary) print(w io.Writer, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	changes := []string{}
	for _, k := range []string{"create", "update", "delete", "link", "unlink"} {
		changes = append(changes, fmt.Sprintf("%d %ss", s.Changes[k], k))
	}
	fmt.Fprintf(tw, "database\t%s\n", s.Database)
	fmt.Fprintf(tw, "written\t%d commits: %s\n", s.Commits, strings.Join(changes, ", "))
	fmt.Fprintf(tw, "events\t%d captured (history and baseline), in %.1fs of workload\n", s.EventsWritten, s.WorkloadSeconds)
	fmt.Fprintf(tw, "published\t%d messages (replays, retries and duplicates included)\n", s.Published)
	fmt.Fprintf(tw, "landed\t%d rows in the local warehouse; %d duplicates absorbed by the views\n", s.Landed, s.DuplicatesAbsorbed)
	fmt.Fprintf(tw, "verified\t%d of %d\n", s.Verified, s.EventsWritten)
	fmt.Fprintf(tw, "replay\t%d events sent back to pending mid-run and published again\n", s.Replayed)
	fmt.Fprintf(tw, "outage\tPub/Sub refused %d publishes during the injected outage; the drains queued again until it took them, %d wake-ups answered 503 meanwhile\n",
		s.OutagePublishes, s.OutageRefusals)
	fmt.Fprintf(tw, "dead letter\t%d message dead-lettered (event %.12s…), retried: %s\n", s.DeadLettered, s.DeadLetterEvent, yes(s.DeadLetterVerified))
	fmt.Fprintf(tw, "retried\t%d absent events looked for again, %d sent back to pending\n", s.Retried, s.Requeued)
	fmt.Fprintf(tw, "time to full verification\t%.1fs after the last commit\n", s.VerifiedAfterSecs)
	for _, v := range s.Views {
		mark := "ok"
		if !v.Match {
			mark = "MISMATCH"
		}
		fmt.Fprintf(tw, "view %s\t%d rows, source table %d, every column compared: %s\n", v.View, v.Rows, v.Source, mark)
	}
	if a := s.Audit; a != nil {
		verdict := "equal"
		if !a.Equal {
			verdict = fmt.Sprintf("DIFFERS (%d differences)", a.Differences)
		}
		fmt.Fprintf(tw, "audit\t%s as of revision %d: %d views, %d buckets compared (`job audit`; it counts every record ever written, deleted ones included, where the view rows above are the live records)\n",
			verdict, a.Watermark, len(a.Views), a.Buckets)
	}
	fmt.Fprintf(tw, "delivery lag\t%.1fs at most (the oldest pending event's wait, sampled every 250 ms)\n", s.MaxDeliveryLagSecs)
	fmt.Fprintf(tw, "verification lag\t%.1fs at most (the oldest accepted event's wait to be found in the warehouse)\n", s.MaxVerificationLagSecs)
	return tw.Flush()
}
