package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/logging"
	"github.com/segmentstream/ontology-replication/shared/registry"
)

const usage = `usage: job <command> [flags]

commands:
  backfill  enqueue the events of a target created before protocol 4, draining as it goes
  replay    send a generation's events back to pending, page by page, draining as it goes
  drain     publish batches until nothing is pending (one drain per pool connection)
  verify    one verifier pass: look accepted events up in BigQuery, then sweep
  status    per workspace: protocol, generation, completion, counts, readiness
  views     create or replace the BigQuery latest-state views of the active target
  local     run the whole pipeline on this machine (no cloud account)

flags (backfill, replay, drain, verify, status, views):
  --workspace W   only this workspace (default: every workspace of the registry,
                  split across Cloud Run tasks by CLOUD_RUN_TASK_INDEX/COUNT)
  --generation G  this generation instead of the active one (backfill, replay, status)
  --json          JSON output (status)
  --budget D      verify: time budget (default 50s)

The registry comes from REPLICATION_WORKSPACES or REPLICATION_WORKSPACES_FILE.`

// jobEnv lists every environment variable the job reads (Cloud Run sets the
// task variables itself).
var jobEnv = []string{registry.EnvInline, registry.EnvFile, delivery.EnvEmulatorHost, "LOG_LEVEL", "CLOUD_RUN_TASK_INDEX", "CLOUD_RUN_TASK_COUNT"}

// env is what a command runs with.
type env struct {
	ctx      context.Context
	getenv   func(string) string
	stdout   io.Writer
	log      *slog.Logger
	progress *progressOutput
	svc      *delivery.Opened

	workspaces []registry.Workspace
	generation string
	json       bool
	budget     time.Duration
}

// commands are the job's commands by name.
var commands = map[string]func(e *env) error{
	"backfill": runBackfill,
	"replay":   runReplay,
	"drain":    runDrain,
	"verify":   runVerify,
	"status":   runStatus,
	"views":    runViews,
}

// run runs one job command. stdout receives results (status tables, JSON);
// stderr receives logs and progress.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(stderr, usage)
		if len(args) == 0 {
			return errors.New("no command given")
		}
		return nil
	}
	name, args := args[0], args[1:]
	if name == "local" {
		return runLocal(ctx, args, getenv, stdout, stderr)
	}
	cmd, ok := commands[name]
	if !ok {
		return fmt.Errorf("unknown command %q (want backfill, replay, drain, verify, status, views or local)", name)
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	workspace := fs.String("workspace", "", "only this workspace")
	generation := fs.String("generation", "", "this generation instead of the active one")
	asJSON := fs.Bool("json", false, "JSON output")
	budget := fs.Duration("budget", 50*time.Second, "verify time budget")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q", name, fs.Arg(0))
	}
	if *generation != "" && *workspace == "" {
		return fmt.Errorf("%s: --generation needs --workspace (a generation belongs to one workspace)", name)
	}
	reg, err := registry.Load(getenv)
	if err != nil {
		return err
	}
	all := reg.Workspaces
	if *workspace != "" {
		ws, ok := reg.Workspace(*workspace)
		if !ok {
			return fmt.Errorf("unknown workspace %q (the registry has %s)", *workspace, ids(reg.Workspaces))
		}
		all = []registry.Workspace{ws}
	}
	mine, err := shard(all, getenv)
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if raw := getenv("LOG_LEVEL"); raw != "" {
		if err := level.UnmarshalText([]byte(raw)); err != nil {
			return fmt.Errorf("LOG_LEVEL %q: want DEBUG, INFO, WARN or ERROR", raw)
		}
	}
	log := logging.New(stderr, level)
	svc, err := delivery.Open(ctx, reg, getenv, delivery.Parts{Logger: log})
	if err != nil {
		return err
	}
	defer svc.Close()
	e := &env{
		ctx: ctx, getenv: getenv, stdout: stdout, log: log, svc: svc,
		progress:   newProgressOutput(stderr, log),
		workspaces: mine, generation: *generation, json: *asJSON, budget: *budget,
	}
	return cmd(e)
}

func ids(ws []registry.Workspace) string {
	var out []string
	for _, w := range ws {
		out = append(out, w.ID)
	}
	return fmt.Sprint(out)
}

// shard returns this Cloud Run task's share of the workspaces: with
// CLOUD_RUN_TASK_COUNT > 1, task i takes the workspaces whose position in id
// order is i modulo the count.
func shard(all []registry.Workspace, getenv func(string) string) ([]registry.Workspace, error) {
	countRaw, indexRaw := getenv("CLOUD_RUN_TASK_COUNT"), getenv("CLOUD_RUN_TASK_INDEX")
	if countRaw == "" {
		return all, nil
	}
	count, err := strconv.Atoi(countRaw)
	if err != nil || count < 1 {
		return nil, fmt.Errorf("CLOUD_RUN_TASK_COUNT %q: want a positive number", countRaw)
	}
	index, err := strconv.Atoi(indexRaw)
	if count > 1 && (err != nil || index < 0 || index >= count) {
		return nil, fmt.Errorf("CLOUD_RUN_TASK_INDEX %q: want 0 to %d", indexRaw, count-1)
	}
	sorted := slices.Clone(all)
	slices.SortFunc(sorted, func(a, b registry.Workspace) int {
		if a.ID < b.ID {
			return -1
		}
		if a.ID > b.ID {
			return 1
		}
		return 0
	})
	var mine []registry.Workspace
	for i, ws := range sorted {
		if i%count == index {
			mine = append(mine, ws)
		}
	}
	return mine, nil
}

// pageTimeout bounds one page. Pages run detached from the job's context,
// so an interrupt stops the job between pages, never inside one.
const pageTimeout = 2 * time.Minute

func (e *env) page() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(e.ctx), pageTimeout)
}

// interrupted is the error of a job stopped by a signal between pages.
func interrupted(command, workspace string, pages int) error {
	return fmt.Errorf("interrupted after %d pages of workspace %s; everything done so far is committed: run `job %s --workspace %s` again to resume",
		pages, workspace, command, workspace)
}
