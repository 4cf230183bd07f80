package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/segmentstream/ontology-replication/shared/cliflags"
	"github.com/segmentstream/ontology-replication/shared/testbench/sandbox"
)

// config is the chaos command's flags: the sandbox's, the run's, and how
// to print its report.
type config struct {
	sandbox sandbox.Config
	chaos   chaosConfig
	json    bool
}

// parseFlags reads the chaos command's flags; -h prints them.
func parseFlags(args []string, stdout io.Writer) (config, error) {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg := config{sandbox: sandbox.Config{Command: "chaos", Chaos: true}}
	fs.DurationVar(&cfg.chaos.duration, "duration", time.Minute, "how long the SDK workload runs under injected faults (at least 45s)")
	fs.Uint64Var(&cfg.chaos.seed, "seed", 0, "the fault schedule's seed (default: from the clock, printed)")
	fs.Float64Var(&cfg.chaos.rate, "rate", 40, "SDK commits per second while the SDK is busy, over all writers, 1 to 500")
	fs.StringVar(&cfg.chaos.plot, "plot", "", "write the run's timeline to this file, as SVG")
	fs.IntVar(&cfg.sandbox.Drains, "drains", 2, "drain instances (processes of the deployed entry point), 1 to 8")
	fs.IntVar(&cfg.sandbox.Writers, "writers", 16, "the SDK's concurrent writers, each waiting for its wake-up's answer, 1 to 32")
	fs.BoolVar(&cfg.json, "json", false, "print the report as JSON, with the fault timeline")
	fs.DurationVar(&cfg.sandbox.VerifyEvery, "verify-every", 2*time.Second, "how often the verifier verifies (its sweep runs once a minute)")
	fs.DurationVar(&cfg.sandbox.VerifyTimeout, "timeout", 3*time.Minute, "how long to wait for full verification once the faults are off")
	fs.BoolVar(&cfg.sandbox.Pooled, "pooled", false, "every component reaches the database through a PgBouncer in session mode, as a fleet's deployment does through a pooler")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, "usage: go run ./job/chaos [flags]\n\nthe SDK's workload on local parts under injected faults, then the proof that every promise was kept\n\nflags:\n"+
				cliflags.Usage(fs))
			return cfg, err
		}
		return cfg, sandbox.Usagef("chaos: %s (go run ./job/chaos -h lists the flags)", cliflags.Dashes(err.Error()))
	}
	if fs.NArg() > 0 {
		return cfg, sandbox.Usagef("chaos: unexpected argument %q (go run ./job/chaos -h lists the flags)", fs.Arg(0))
	}
	if cfg.chaos.duration < minChaos || cfg.chaos.rate < 1 || cfg.chaos.rate > 500 || cfg.sandbox.Drains < 1 || cfg.sandbox.Drains > 8 ||
		cfg.sandbox.Writers < 1 || cfg.sandbox.Writers > 32 {
		return cfg, sandbox.Usagef("chaos: --duration must be at least 45s, --rate between 1 and 500, --drains between 1 and 8 and --writers between 1 and 32")
	}
	if cfg.chaos.seed == 0 {
		cfg.chaos.seed = uint64(time.Now().UnixNano()%1_000_000) + 1
	}
	// A slow BigQuery answer then meets the lookup's own 20 s time-out
	// before the pass's budget.
	cfg.sandbox.VerifyBudget = 30 * time.Second
	return cfg, nil
}

// runChaosCommand starts every part, runs the chaos run, prints its report
// and fails unless every proof held.
func runChaosCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stdout)
	if err != nil {
		return err
	}
	l, err := sandbox.Open(ctx, cfg.sandbox, getenv, stdout, stderr)
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	defer l.Close()
	stopProgress := l.ShowProgress(ctx)
	rep, err := runChaos(ctx, l, cfg.chaos)
	stopProgress()
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	if err := rep.print(stdout, cfg.json); err != nil {
		return err
	}
	return rep.failure()
}
