package main

// The commands' flags: their help, parsing and checks, and the retry
// budget they set.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/segmentstream/ontology-replication/shared/cliflags"
	"github.com/segmentstream/ontology-replication/shared/delivery"
)

// flagHelp documents each flag.
var flagHelp = map[string]string{
	"workspace":       "only this workspace (default: every workspace of the registry, split across Cloud Run tasks)",
	"retry-budget":    "how long a step that meets a transient fault is retried, from its first failed attempt's start, 1s to 1h (default: REPLICATION_RETRY_BUDGET, or 2m; status: 10s)",
	"generation":      "this generation instead of the active one (needs --workspace)",
	"parallel":        "how many workspaces at once (default 4): each holds one pool of DATABASE_POOL_SIZE connections",
	"json":            "write the result as one JSON document",
	"budget":          "the pass's time budget, 1s to 1h (default 50s)",
	"restart":         "start a new replay even if the last one's events are not all published yet",
	"retry":           "end the backoff of the set-aside events now, so that the next drain tries them",
	"republish":       "publish the dead-lettered messages to the events topic again and acknowledge them",
	"discard":         "acknowledge the dead-lettered messages (they are gone; each event is logged): for events that can never land",
	"events":          "only these event ids (comma-separated) are republished or discarded; the others stay",
	"max":             "the most dead-lettered messages to read per workspace (default 1000)",
	"watch":           "refresh every interval (for example 10s) until interrupted",
	"entity":          "only these entities (names, comma-separated; an entity's relationships with it)",
	"records":         "only these record keys (comma-separated)",
	"recheck-after":   "judge the differences found again after this long, from a new read of both sides, and report only those confirmed (0: no recheck; default 30s)",
	"since-revision":  "only the events of this revision or later",
	"accepted-before": "only the events delivered before this time (RFC 3339; default: when the replay starts): resumes a stopped partial replay",
}

// parseFlags parses a command's flags into e and returns the workspace
// asked for, or the command's help when asked for it.
func (e *env) parseFlags(cmd command, args []string) (workspace, help string, err error) {
	name := cmd.name
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	define := map[string]func(){
		"generation": func() { fs.StringVar(&e.generation, "generation", "", flagHelp["generation"]) },
		"parallel":   func() { fs.IntVar(&e.parallel, "parallel", 4, flagHelp["parallel"]) },
		"json":       func() { fs.BoolVar(&e.json, "json", false, flagHelp["json"]) },
		"budget":     func() { fs.DurationVar(&e.budget, "budget", delivery.DefaultVerifyBudget, flagHelp["budget"]) },
		"restart":    func() { fs.BoolVar(&e.restart, "restart", false, flagHelp["restart"]) },
		"retry":      func() { fs.BoolVar(&e.retry, "retry", false, flagHelp["retry"]) },
		"republish":  func() { fs.BoolVar(&e.republish, "republish", false, flagHelp["republish"]) },
		"discard":    func() { fs.BoolVar(&e.discard, "discard", false, flagHelp["discard"]) },
		"events":     func() { fs.Func("events", flagHelp["events"], listFlag(&e.events)) },
		"max":        func() { fs.IntVar(&e.max, "max", 1000, flagHelp["max"]) },
		"watch":      func() { fs.DurationVar(&e.watch, "watch", 0, flagHelp["watch"]) },
		"entity":     func() { fs.Func("entity", flagHelp["entity"], listFlag(&e.entities)) },
		"records":    func() { fs.Func("records", flagHelp["records"], listFlag(&e.records)) },
		"recheck-after": func() {
			fs.DurationVar(&e.recheck, "recheck-after", delivery.DefaultAuditRecheck, flagHelp["recheck-after"])
		},
		"since-revision": func() { fs.Int64Var(&e.since, "since-revision", 0, flagHelp["since-revision"]) },
		"accepted-before": func() {
			fs.Func("accepted-before", flagHelp["accepted-before"], func(v string) (err error) {
				if e.before, err = time.Parse(time.RFC3339Nano, v); err != nil {
					return fmt.Errorf("%q is not an RFC 3339 time such as 2026-12-03T01:30:00.123456Z (the bound a stopped replay printed)", v)
				}
				return nil
			})
		},
	}
	fs.StringVar(&workspace, "workspace", "", flagHelp["workspace"])
	fs.DurationVar(&e.retryBudget, "retry-budget", 0, flagHelp["retry-budget"])
	for _, f := range cmd.flags {
		define[f]()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return "", commandUsage(cmd, fs), nil
		}
		return "", "", usagef("%s: %s (job %s -h lists its flags)", name, cliflags.Dashes(err.Error()), name)
	}
	if fs.NArg() > 0 {
		return "", "", usagef("%s: unexpected argument %q", name, fs.Arg(0))
	}
	return workspace, "", nil
}

// checkFlags refuses flag values out of range and combinations that make
// no sense, as usage errors.
func (e *env) checkFlags(cmd command, workspace string) error {
	name := cmd.name
	takes := func(f string) bool { return slices.Contains(cmd.flags, f) }
	if !takes("parallel") {
		e.parallel = 1
	}
	switch {
	case e.retryBudget != 0 && (e.retryBudget < time.Second || e.retryBudget > time.Hour):
		return usagef("%s: --retry-budget %v must be between 1s and 1h", name, e.retryBudget)
	case e.generation != "" && workspace == "":
		return usagef("%s: --generation needs --workspace (a generation belongs to one workspace)", name)
	case e.parallel < 1 || e.parallel > 64:
		return usagef("%s: --parallel %d: want 1 to 64", name, e.parallel)
	case takes("budget") && (e.budget < time.Second || e.budget > time.Hour):
		return usagef("%s: --budget %v: want 1s to 1h", name, e.budget)
	case takes("max") && (e.max < 1 || e.max > 100_000):
		return usagef("%s: --max %d: want 1 to 100000", name, e.max)
	case e.watch != 0 && e.watch < time.Second:
		return usagef("%s: --watch %v: want at least 1s", name, e.watch)
	case e.republish && e.discard:
		return usagef("%s: --republish or --discard, not both", name)
	case len(e.events) > 0 && !e.republish && !e.discard:
		return usagef("%s: --events chooses what --republish or --discard acts on; give one of them", name)
	case e.recheck < 0 || e.recheck > time.Hour:
		return usagef("%s: --recheck-after %v: want 0 to 1h", name, e.recheck)
	case e.since < 0:
		return usagef("%s: --since-revision %d: want a revision (0 or more)", name, e.since)
	case e.restart && e.selection().Partial():
		return usagef("%s: --restart is for the whole generation's replay; a partial replay resumes with --accepted-before", name)
	}
	return nil
}

// listFlag parses a comma-separated flag into list, adding to what an
// earlier use of the flag gave; empty items are refused.
func listFlag(list *[]string) func(string) error {
	return func(v string) error {
		for _, item := range strings.Split(v, ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				return fmt.Errorf("an empty item in %q", v)
			}
			*list = append(*list, item)
		}
		return nil
	}
}

func commandUsage(c command, fs *flag.FlagSet) string {
	return fmt.Sprintf("usage: job %s [flags]\n\n%s\n\nflags:\n%s", c.name, c.summary, cliflags.Usage(fs))
}

// statusRetryBudget is status's retry budget unless one is set: a person
// asking for the status of an unreachable database wants the answer in
// seconds, not after two minutes of retries.
const statusRetryBudget = 10 * time.Second

// retryBudgetFor is the command's retry budget: --retry-budget, else
// REPLICATION_RETRY_BUDGET (env), else status's own or the default.
func (e *env) retryBudgetFor(command string, env time.Duration) time.Duration {
	switch {
	case e.retryBudget != 0:
		return e.retryBudget
	case env != 0:
		return env
	case command == "status":
		return statusRetryBudget
	}
	return 0
}
