package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/segmentstream/ontology-replication/shared/cliflags"
	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
)

// localConfig is the local command's flags: the sandbox's, and the
// workload's size and what to do with its summary.
type localConfig struct {
	sandbox sandbox.Config
	records int
	keep    bool
	json    bool
}

// parseLocalFlags reads the local command's flags; -h prints them.
func parseLocalFlags(args []string, stdout io.Writer) (localConfig, error) {
	fs := flag.NewFlagSet("local", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg := localConfig{sandbox: sandbox.Config{Command: "local"}}
	fs.IntVar(&cfg.records, "records", 3000, "how many changes the workload commits")
	fs.IntVar(&cfg.sandbox.Writers, "writers", 4, "concurrent writers")
	fs.BoolVar(&cfg.keep, "keep", false, "keep everything running after the summary, until Ctrl-C")
	fs.BoolVar(&cfg.json, "json", false, "print the summary as JSON")
	fs.DurationVar(&cfg.sandbox.VerifyEvery, "verify-every", 2*time.Second, "how often the verifier runs")
	fs.DurationVar(&cfg.sandbox.VerifyTimeout, "timeout", 3*time.Minute, "how long to wait for full verification after the workload")
	fs.BoolVar(&cfg.sandbox.CloudSQL, "cloud-sql", false, "every component reaches the database as production does: through the Cloud SQL Go connector, IAM login, private IP, to a local Cloud SQL stand-in in front of PostgreSQL")
	fs.BoolVar(&cfg.sandbox.Pooled, "pooled", false, "every component reaches the database through a PgBouncer in session mode, as a fleet's deployment does through a pooler (registry database.pooled)")
	for _, a := range args {
		if a == "--chaos" || a == "-chaos" || strings.HasPrefix(a, "--chaos=") {
			return cfg, sandbox.Usagef("local: the chaos run is a command of its own now: go run ./job/chaos --duration D")
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, "usage: go run ./job/local [flags]\n\nthe whole pipeline on this machine: PostgreSQL, Pub/Sub, a local warehouse, the functions and a workload"+
				"\n(the chaos run is go run ./job/chaos)\n\nflags:\n"+cliflags.Usage(fs))
			return cfg, err
		}
		return cfg, sandbox.Usagef("local: %s (go run ./job/local -h lists the flags)", cliflags.Dashes(err.Error()))
	}
	if fs.NArg() > 0 {
		return cfg, sandbox.Usagef("local: unexpected argument %q (go run ./job/local -h lists the flags)", fs.Arg(0))
	}
	if cfg.records < 20 || cfg.sandbox.Writers < 1 || cfg.sandbox.Writers > 32 {
		return cfg, sandbox.Usagef("local: --records must be at least 20 and --writers between 1 and 32")
	}
	cfg.sandbox.VerifyBudget = 10 * time.Second
	if cfg.sandbox.CloudSQL && cfg.keep {
		// --keep's job commands reach the database again: through Cloud
		// SQL only with Google's Admin API and credentials.
		return cfg, sandbox.Usagef("local: --cloud-sql runs every component in this process: it goes without --keep")
	}
	if cfg.sandbox.Pooled && cfg.sandbox.CloudSQL {
		return cfg, sandbox.Usagef("local: --pooled and --cloud-sql are two ways to the database: choose one")
	}
	return cfg, nil
}

// runLocal starts every part, runs the workload, prints the summary and,
// with --keep, serves the sandbox until ctx ends.
func runLocal(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseLocalFlags(args, stdout)
	if err != nil {
		return err
	}
	l, err := sandbox.Open(ctx, cfg.sandbox, getenv, stdout, stderr)
	if err != nil {
		return fmt.Errorf("local: %w", err)
	}
	defer l.Close()
	stopProgress := l.ShowProgress(ctx)
	sum, err := runWorkload(ctx, l, cfg.records)
	stopProgress()
	if err != nil {
		return fmt.Errorf("local: %w", err)
	}
	pendingLag, verifyLag := l.Progress.Lags()
	sum.MaxDeliveryLagSecs, sum.MaxVerificationLagSecs = pendingLag.Seconds(), verifyLag.Seconds()
	sum.Database, sum.databaseProblem = l.DatabasePath(), l.CloudSQLProblem()
	l.Progress.Enter("done", "")
	if l.Progress.Terminal {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if err := sum.print(stdout, cfg.json); err != nil {
		return err
	}
	if cfg.keep {
		keepServing(ctx, l)
	}
	return sum.failure()
}

// keepServing keeps the sandbox working until ctx ends: the warehouse is
// fed from the subscription and the verifier runs on its schedule, so that
// what the job's commands publish (a repair, a replay) lands and is
// verified.
func keepServing(ctx context.Context, l *sandbox.Local) {
	printKeep(l)
	go func() { _ = l.Feeder.Run(ctx) }()
	go sandbox.Every(ctx, l.Config.VerifyEvery, func() { l.CallVerify(ctx) })
	<-ctx.Done()
	fmt.Fprintln(l.Out, "stopping and cleaning up")
}

// printKeep prints how to reach each part of the sandbox kept running.
func printKeep(l *sandbox.Local) {
	w := l.Out
	token, _ := l.Issuer.Token(sandbox.LocalSubject, sandbox.LocalAudience, 24*time.Hour)
	fmt.Fprintf(w, `
Everything keeps running until Ctrl-C:
  ontology database   psql '%s'
  warehouse database  psql '%s'   (table events, views customer, product, order, order_products)
  drain               curl -X POST -H 'x-segmentstream-runtime-identity: %s' -H 'x-segmentstream-organization-id: %s' %s
  verifier            curl -X POST %s
  BigQuery (REST)     %s
  Pub/Sub emulator    PUBSUB_EMULATOR_HOST=%s
  registry            REPLICATION_WORKSPACES='%s'

The job's commands run against these parts (no Google credentials needed) after:
  export REPLICATION_WORKSPACES='%[9]s' PUBSUB_EMULATOR_HOST=%[8]s
for example:
  go run ./job status                      # counts, lags, set-aside events, dead letters
  go run ./job dead-letter                 # the demo's dead-lettered event
  go run ./job dead-letter --discard       # remove it (it was retried and verified)
  go run ./job replay --entity customer    # send the customers back; they land again
  go run ./job audit                       # the warehouse against the source: exit 0 when equal
`, l.Urls.OntologyDB, l.Urls.WarehouseDB, token, sandbox.LocalOrganization, l.Urls.Drains[0], l.Urls.Verify, l.Urls.Bigquery, l.Pubsub.Addr, compact(l.Registry))
}

// compact folds a registry's lines and runs of spaces into single spaces.
func compact(s string) string {
	out := make([]byte, 0, len(s))
	space := false
	for _, c := range []byte(s) {
		if c == '\n' || c == ' ' {
			if !space {
				out = append(out, ' ')
			}
			space = true
			continue
		}
		space = false
		out = append(out, c)
	}
	return string(out)
}
