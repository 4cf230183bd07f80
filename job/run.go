package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentstream/ontology-replication/shared/config"
	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/logging"
	"github.com/segmentstream/ontology-replication/shared/registry"
)

// command is one of the job's commands.
type command struct {
	name    string
	summary string
	// flags are the flags the command takes, beyond --workspace.
	flags []string
	run   func(e *env) error
}

// commands are the job's commands, in the order usage lists them.
var commands = []command{
	{"backfill", "enqueue the events of a target created before protocol 4, draining as it goes", []string{"generation", "parallel", "json"}, runBackfill},
	{"replay", "send a generation's events (or those selected) back to pending, page by page, draining as it goes", []string{"generation", "entity", "since-revision", "records", "accepted-before", "parallel", "restart", "json"}, runReplay},
	{"drain", "publish batches until nothing publishable is pending", []string{"parallel", "json"}, runDrain},
	{"verify", "one verifier pass: look accepted events up in BigQuery, then sweep", []string{"budget", "parallel", "json"}, runVerify},
	{"status", "per workspace: protocol, generation, completion, counts, lags, set-aside events", []string{"generation", "parallel", "json", "watch"}, runStatus},
	{"views", "create or replace the BigQuery latest-state views of the active target", []string{"parallel", "json"}, runViews},
	{"set-aside", "list the events set aside because they cannot be published; --retry tries them now", []string{"retry", "parallel", "json"}, runSetAside},
	{"audit", "compare the warehouse's latest state with the source's, record by record at a bounded cost; exit 1 when they differ", []string{"entity", "records", "recheck-after", "parallel", "json"}, runAudit},
	{"repair", "re-deliver what an audit finds missing, stale or deleted at the source (or the chosen records), then drain", []string{"entity", "records", "recheck-after", "parallel", "json"}, runRepair},
	{"dead-letter", "list the dead-letter subscription's events; --republish publishes them again, --discard removes them", []string{"republish", "discard", "events", "max", "json"}, runDeadLetter},
}

func usage() string {
	var b strings.Builder
	b.WriteString("usage: job <command> [flags]\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-12s %s\n", c.name, c.summary)
	}
	b.WriteString("\n`job <command> -h` lists a command's flags. The registry comes from REPLICATION_WORKSPACES\n")
	b.WriteString("or REPLICATION_WORKSPACES_FILE. The local mode is `go run ./job/local`; `job --version` says which build this is.")
	return b.String()
}

// usageError is a mistake in the command line: the job exits 2.
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// defaultPoolSize is the job's connections per workspace database: pages on
// one, drains on the others.
const defaultPoolSize = 4

// env is what a command runs with.
type env struct {
	ctx      context.Context
	stdout   io.Writer
	log      *slog.Logger
	progress *progressOutput
	svc      *delivery.Opened
	reg      *registry.Registry
	poolSize int32

	workspaces []registry.Workspace
	generation string
	json       bool
	parallel   int
	budget     time.Duration
	restart    bool
	retry      bool
	republish  bool
	discard    bool
	events     []string
	max        int
	watch      time.Duration
	entities   []string
	records    []string
	recheck    time.Duration
	since      int64
	before     time.Time
	// retryBudget is --retry-budget (0: REPLICATION_RETRY_BUDGET, or the
	// command's default).
	retryBudget time.Duration
}

// run runs one job command. stdout receives results (tables, JSON); stderr
// receives logs and progress.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage())
		return usagef("no command given (job -h lists them)")
	}
	switch args[0] {
	case "-h", "--help", "help":
		if args[0] == "help" && len(args) > 1 {
			return run(ctx, []string{args[1], "--help"}, getenv, stdout, stderr) // job help <command>
		}
		fmt.Fprintln(stdout, usage())
		return nil
	case "--version", "version":
		fmt.Fprintln(stdout, version())
		return nil
	}
	name, args := args[0], args[1:]
	if name == "local" {
		return usagef("the local mode is its own command now: go run ./job/local")
	}
	i := slices.IndexFunc(commands, func(c command) bool { return c.name == name })
	if i < 0 {
		return usagef("unknown command %q (job -h lists them)", name)
	}
	cmd := commands[i]
	e := &env{ctx: ctx, stdout: stdout}
	workspace, help, err := e.parseFlags(cmd, args)
	if err != nil || help != "" {
		if help != "" {
			fmt.Fprintln(stdout, help)
		}
		return err
	}
	if err := e.checkFlags(cmd, workspace); err != nil {
		return err
	}
	if err := e.open(cmd, workspace, getenv, stderr); err != nil {
		return err
	}
	defer e.svc.Close()
	return cmd.run(e)
}

// open reads the settings and the registry, picks the workspaces (this
// task's share of them) and opens the delivery service.
func (e *env) open(cmd command, workspace string, getenv func(string) string, stderr io.Writer) error {
	ctx, name := e.ctx, cmd.name
	settings, err := config.Read(getenv, defaultPoolSize)
	if err != nil {
		return err
	}
	e.reg, e.poolSize = settings.Registry, settings.PoolSize
	all := e.reg.Workspaces
	if workspace != "" {
		ws, ok := e.reg.Workspace(workspace)
		if !ok {
			return usagef("unknown workspace %q (the registry has %d: %s)", workspace, len(all), ids(all, 10))
		}
		all = []registry.Workspace{ws}
	}
	if e.workspaces, err = shard(all, getenv); err != nil {
		return usageError{err}
	}
	if e.log, err = newLogger(stderr, getenv(config.EnvLogFormat), logging.Config{Level: settings.LogLevel, ProjectID: settings.ProjectID,
		Service: "replication-job"}); err != nil {
		return usageError{err}
	}
	e.progress = newProgressOutput(stderr, e.log)
	budget := e.retryBudgetFor(name, settings.RetryBudget)
	maxOpen := e.parallel
	if name == "verify" {
		maxOpen = e.parallel * delivery.VerifyUnitSize
	}
	e.svc, err = delivery.Open(ctx, delivery.OpenConfig{
		Registry:           e.reg,
		PubSubEmulatorHost: settings.EmulatorHost,
		// A command walks many workspaces: each workspace's pool is held
		// for as long as the command works on it (Service.ForEach) and
		// closed when it is done, at most --parallel at once (a verify pass
		// verifies up to VerifyUnitSize workspaces sharing an events table
		// together, holding their pools); connections to one server are
		// bounded by DATABASE_SERVER_MAX_CONNS whatever the pools.
		// A connect is given no longer than the retry budget: a silent
		// server ends the command within it, not a connect timeout later.
		Pools: database.Config{MaxConns: settings.PoolSize, MaxOpen: cmp.Or(settings.MaxOpenPools, maxOpen), IdleTimeout: -1,
			ServerMaxConns: settings.ServerMaxConns, ConnectTimeout: min(database.DefaultConnectTimeout, budget)},
		Retry:            delivery.RetryPolicy{Budget: budget},
		Logger:           e.log,
		DeadLetterReader: name == "dead-letter" || name == "status",
		// The read-only commands (status, audit, set-aside) never open a
		// Pub/Sub client: they run without Pub/Sub credentials.
		OnDemand: true,
	})
	return err
}

func ids(ws []registry.Workspace, most int) string {
	var out []string
	for i, w := range ws {
		if i == most {
			out = append(out, fmt.Sprintf("and %d more", len(ws)-most))
			break
		}
		out = append(out, w.ID)
	}
	return strings.Join(out, ", ")
}

// shard returns this Cloud Run task's share of the workspaces: with
// CLOUD_RUN_TASK_COUNT > 1, task i takes the workspaces whose position in id
// order is i modulo the count (delivery.Shard, the verifier's rule too).
func shard(all []registry.Workspace, getenv func(string) string) ([]registry.Workspace, error) {
	countRaw, indexRaw := getenv("CLOUD_RUN_TASK_COUNT"), getenv("CLOUD_RUN_TASK_INDEX")
	if countRaw == "" {
		return all, nil
	}
	count, err := strconv.Atoi(countRaw)
	if err != nil || count < 1 {
		return nil, fmt.Errorf("CLOUD_RUN_TASK_COUNT %q: want a positive number", countRaw)
	}
	index, err := strconv.Atoi(cmp.Or(indexRaw, "0"))
	if err != nil || index < 0 || index >= count {
		return nil, fmt.Errorf("CLOUD_RUN_TASK_INDEX %q: want 0 to %d", indexRaw, count-1)
	}
	return delivery.Shard(all, index, count), nil
}

// eachWorkspace runs fn for the task's workspaces, --parallel at a time,
// carrying on past a failing one; it writes the summary and fails at the
// end when any workspace failed, naming them.
func (e *env) eachWorkspace(name string, fn func(ctx context.Context, ws registry.Workspace) (any, error)) error {
	results := e.svc.ForEach(e.ctx, e.workspaces, e.parallel, fn)
	return e.summarise(name, results)
}

// workspaceLine is one workspace's line of a command's summary.
type workspaceLine struct {
	Workspace string `json:"workspace"`
	OK        bool   `json:"ok"`
	Error     string `json:"error,omitempty"`
	Result    any    `json:"result,omitempty"`
}

// summarise writes a command's per-workspace summary (a table, or JSON)
// and returns an error naming the workspaces that failed.
func (e *env) summarise(name string, results []delivery.WorkspaceResult) error {
	lines := make([]workspaceLine, len(results))
	interrupted := false
	for i, r := range results {
		lines[i] = workspaceLine{Workspace: r.Workspace, OK: r.Err == nil, Result: r.Detail}
		if r.Err != nil {
			lines[i].Error = oneLine(r.Err.Error())
			// A first SIGINT or SIGTERM cancels the command's context: work
			// that failed once it was (a replay's set-up, a status whose
			// query the cancel cut, however the driver words it) was
			// interrupted, not failed.
			stopped := e.ctx.Err() != nil && !errors.Is(r.Err, delivery.ErrInterrupted)
			if stopped {
				lines[i].Error = "interrupted before it finished"
			}
			interrupted = interrupted || errors.Is(r.Err, delivery.ErrInterrupted) || stopped
		}
	}
	if e.json {
		if err := e.writeJSON(map[string]any{"command": name, "workspaces": lines}); err != nil {
			return err
		}
	} else {
		for _, l := range lines {
			if !l.OK {
				fmt.Fprintf(e.stdout, "%s\tFAILED: %s\n", l.Workspace, l.Error)
				continue
			}
			t, ok := l.Result.(texter)
			if !ok {
				fmt.Fprintf(e.stdout, "%s\tok\n", l.Workspace)
				continue
			}
			for _, line := range t.text() {
				fmt.Fprintf(e.stdout, "%s\t%s\n", l.Workspace, line)
			}
		}
	}
	resume := "run the same command again to resume"
	if name == "replay" && e.selection().Partial() && e.before.IsZero() {
		resume = "to resume, run the same command with the --accepted-before its workspace's line gives"
	}
	return failure(name, lines, interrupted, resume, e.causesShown())
}

// causesShown reports whether the summary just written shows each failed
// workspace's cause to the person reading the command's error: a table on
// the same terminal. The error then names the workspaces only, so that a
// cause is not printed twice.
func (e *env) causesShown() bool { return !e.json && isTerminal(e.stdout) }

// failure is a command's error when workspaces failed, naming them: with
// their causes (unless shown, on the lines above), or, when interrupted,
// saying how to resume.
func failure(name string, lines []workspaceLine, interrupted bool, resume string, shown bool) error {
	var failed, causes []string
	for _, l := range lines {
		if !l.OK {
			failed = append(failed, l.Workspace)
			causes = append(causes, l.Workspace+": "+l.Error)
		}
	}
	results := lines
	switch {
	case len(failed) == 0:
		return nil
	case interrupted:
		return fmt.Errorf("%s interrupted; everything done so far is committed: %s (%d of %d workspaces not finished: %s)",
			name, resume, len(failed), len(results), strings.Join(first(failed, 10), ", "))
	case shown && len(results) == 1:
		return fmt.Errorf("%s failed for %s (the cause is on its line above)", name, failed[0])
	case shown:
		return fmt.Errorf("%s failed for %d of %d workspaces: %s (each cause is on its line above)", name, len(failed), len(results),
			strings.Join(first(failed, 10), ", "))
	case len(results) == 1:
		return fmt.Errorf("%s failed for %s", name, causes[0])
	}
	if len(failed) == len(results) {
		return fmt.Errorf("%s failed for all %d workspaces: %s", name, len(results), strings.Join(first(causes, 5), "; "))
	}
	return fmt.Errorf("%s failed for %d of %d workspaces (the others finished): %s", name, len(failed), len(results), strings.Join(first(causes, 5), "; "))
}

// texter is a command's result that writes itself as lines of text.
type texter interface{ text() []string }

func first(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(slices.Clone(s[:n]), fmt.Sprintf("and %d more", len(s)-n))
}

// newLogger is the job's logger: lines for a person on a terminal, Cloud
// Logging's JSON anywhere else, or as format (config.EnvLogFormat) says.
func newLogger(w io.Writer, format string, cfg logging.Config) (*slog.Logger, error) {
	switch format {
	case "json":
		return logging.New(w, cfg), nil
	case "text":
		return logging.NewText(w, cfg), nil
	case "":
		if isTerminal(w) {
			return logging.NewText(w, cfg), nil
		}
		return logging.New(w, cfg), nil
	}
	return nil, fmt.Errorf("%s=%q: json, text, or unset (text on a terminal, JSON elsewhere)", config.EnvLogFormat, format)
}
