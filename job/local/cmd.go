package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/segmentstream/ontology-replication/shared/cliflags"
	"github.com/segmentstream/ontology-replication/shared/logging"
)

// parseLocalFlags reads the local command's flags; -h prints them.
func parseLocalFlags(args []string, stdout io.Writer) (localConfig, error) {
	fs := flag.NewFlagSet("local", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var cfg localConfig
	fs.IntVar(&cfg.records, "records", 3000, "how many changes the workload commits")
	fs.IntVar(&cfg.writers, "writers", 4, "concurrent writers (16 with --chaos)")
	fs.BoolVar(&cfg.keep, "keep", false, "keep everything running after the summary, until Ctrl-C")
	fs.BoolVar(&cfg.json, "json", false, "print the summary as JSON")
	fs.DurationVar(&cfg.verifyEvery, "verify-every", 2*time.Second, "how often the verifier runs")
	fs.DurationVar(&cfg.verifyTimeout, "timeout", 3*time.Minute, "how long to wait for full verification after the workload")
	fs.DurationVar(&cfg.chaos.duration, "chaos", 0, "run the SDK workload for this long under injected faults, then prove nothing was lost (at least 45s)")
	fs.Uint64Var(&cfg.chaos.seed, "seed", 0, "with --chaos: the fault schedule's seed (default: from the clock, printed)")
	fs.Float64Var(&cfg.chaos.rate, "rate", 40, "with --chaos: SDK commits per second while the SDK is busy, over all writers")
	fs.StringVar(&cfg.chaos.plot, "plot", "", "with --chaos: write the run's timeline to this file, as SVG")
	fs.IntVar(&cfg.drains, "drains", 2, "with --chaos: drain instances (processes of the deployed entry point), 1 to 8")
	fs.BoolVar(&cfg.cloudSQL, "cloud-sql", false, "every component reaches the database as production does: through the Cloud SQL Go connector, IAM login, private IP, to a local Cloud SQL stand-in in front of PostgreSQL")
	fs.BoolVar(&cfg.pooled, "pooled", false, "every component reaches the database through a PgBouncer in session mode, as a fleet's deployment does through a pooler (registry database.pooled)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, "usage: go run ./job/local [flags]\n\nthe whole pipeline on this machine: PostgreSQL, Pub/Sub, a local warehouse, the functions and a workload\n\nflags:\n"+
				cliflags.Usage(fs))
			return cfg, err
		}
		return cfg, usageError{fmt.Errorf("local: %s (go run ./job/local -h lists the flags)", cliflags.Dashes(err.Error()))}
	}
	if fs.NArg() > 0 {
		return cfg, usageError{fmt.Errorf("local: unexpected argument %q (go run ./job/local -h lists the flags)", fs.Arg(0))}
	}
	if cfg.records < 20 || cfg.writers < 1 || cfg.writers > 32 {
		return cfg, usageError{errors.New("local: --records must be at least 20 and --writers between 1 and 32")}
	}
	cfg.verifyBudget = 10 * time.Second
	if cfg.cloudSQL && (cfg.chaos.duration != 0 || cfg.keep) {
		// The chaos run's drains are processes of the deployed entry
		// point, and --keep's job commands others again: those reach Cloud
		// SQL only with Google's Admin API and credentials.
		return cfg, usageError{errors.New("local: --cloud-sql runs every component in this process: it goes without --chaos and --keep")}
	}
	if cfg.pooled && cfg.cloudSQL {
		return cfg, usageError{errors.New("local: --pooled and --cloud-sql are two ways to the database: choose one")}
	}
	if cfg.chaos.plot != "" && cfg.chaos.duration == 0 {
		return cfg, usageError{errors.New("local: --plot draws a chaos run: it needs --chaos")}
	}
	if cfg.chaos.duration != 0 {
		writersSet := false
		fs.Visit(func(f *flag.Flag) { writersSet = writersSet || f.Name == "writers" })
		if !writersSet {
			cfg.writers = 16 // the SDK's writers wait for each wake-up's answer
		}
		if cfg.chaos.duration < minChaos || cfg.keep || cfg.chaos.rate < 1 || cfg.chaos.rate > 500 || cfg.drains < 1 || cfg.drains > 8 {
			return cfg, usageError{errors.New("local: --chaos must be at least 45s, without --keep, with --rate between 1 and 500 and --drains between 1 and 8")}
		}
		if cfg.chaos.seed == 0 {
			cfg.chaos.seed = uint64(time.Now().UnixNano()%1_000_000) + 1
		}
		// A slow BigQuery answer then meets the lookup's own 20 s time-out
		// before the pass's budget.
		cfg.verifyBudget = 30 * time.Second
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
	// Quiet by default: the summary says what happened (the injected outage
	// alone makes a hundred 503s). LOG_LEVEL=INFO shows every invocation.
	level := slog.LevelError + 4
	if raw := getenv("LOG_LEVEL"); raw != "" {
		var err error
		if level, err = logging.ParseLevel(raw); err != nil {
			return fmt.Errorf("local: LOG_LEVEL: %w", err)
		}
	}
	l := &local{cfg: cfg, log: logging.New(stderr, logging.Config{Level: level}), out: stdout, logLevel: level.String(), logs: io.Discard}
	if getenv("LOG_LEVEL") != "" {
		l.logs = stderr
	}
	defer l.close()
	l.progress = newProgress(stderr, l)
	l.progress.commits = l.commits.Load
	l.progress.enter("starting PostgreSQL, Pub/Sub, the local warehouse and the functions", "")
	if err := l.start(ctx); err != nil {
		return fmt.Errorf("local: %w", err)
	}
	progressCtx, stopProgress := context.WithCancel(ctx)
	progressDone := make(chan struct{})
	go func() { defer close(progressDone); l.progress.run(progressCtx) }()
	if cfg.chaos.duration != 0 {
		rep, err := runChaos(ctx, l, cfg.chaos)
		stopProgress()
		<-progressDone
		if err != nil {
			return fmt.Errorf("local: chaos: %w", err)
		}
		if err := rep.print(stdout, cfg.json); err != nil {
			return err
		}
		return rep.failure()
	}
	sum, err := runWorkload(ctx, l)
	stopProgress()
	<-progressDone
	if err != nil {
		return fmt.Errorf("local: %w", err)
	}
	pendingLag, verifyLag := l.progress.lags()
	sum.MaxDeliveryLagSecs, sum.MaxVerificationLagSecs = pendingLag.Seconds(), verifyLag.Seconds()
	sum.Database, sum.databaseProblem = l.databasePath(), l.cloudSQLProblem()
	l.progress.enter("done", "")
	if l.progress.terminal {
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
func keepServing(ctx context.Context, l *local) {
	printKeep(l)
	go func() { _ = l.feeder.Run(ctx) }()
	go every(ctx, l.cfg.verifyEvery, func() { l.callVerify(ctx) })
	<-ctx.Done()
	fmt.Fprintln(l.out, "stopping and cleaning up")
}

func printKeep(l *local) {
	w := l.out
	token, _ := l.issuer.Token(localSubject, localAudience, 24*time.Hour)
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
`, l.urls.ontologyDB, l.urls.warehouseDB, token, localOrganization, l.urls.drains[0], l.urls.verify, l.urls.bigquery, l.pubsub.Addr, compact(l.registry))
}

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
