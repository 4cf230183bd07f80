// Command job is the replication Cloud Run job; the same binary runs
// anywhere the registry's databases are reachable.
//
//	job <command> [flags]
//
// Commands: backfill, replay, drain, verify, status, views, audit, repair,
// set-aside and dead-letter (`job -h` lists them, `job <command> -h` their flags). Every
// page is its own transaction and state lives only in the database, so a
// job killed at any moment continues where it stopped when run again. The
// first SIGINT or SIGTERM stops it after the current page; a second stops
// it at once. The local mode, which runs the whole pipeline on this
// machine, is its own command: go run ./job/local. `job help <command>`
// is `job <command> -h`.
//
// Log lines go to stderr: on a terminal one line for a person each
// ("15:04:05 WARNING message key=value …"), anywhere else (a Cloud Run
// execution, a pipe, a file) Cloud Logging's JSON; LOG_FORMAT=json or text
// chooses.
//
// # JSON output
//
// Every command takes `--json` and writes one document (compact when not on
// a terminal, so a pipe gets one line): `{"command": "<name>", "workspaces":
// [{"workspace", "ok", "error", "result"}]}`, `result` being the command's
// own. Keys are lower-case with underscores, as the log fields are; times
// are RFC 3339 strings; durations are numbers of seconds named `*_seconds`,
// as in the logs (`TestJSONIsOneDocument` holds every command to that).
// `status --json` is the array of workspaces itself (one line per interval
// with `--watch`).
//
//   - `backfill`, `replay`: `generation`, `pages`, `rows` (enqueued or sent
//     back), `resumed`, `selection` (a partial replay's `entities`,
//     `since_revision`, `records`, `accepted_before`), `drained` (as `drain`)
//   - `drain`: `published`, `set_aside`, `paused`, `state`
//   - `verify`: `generation`, `state`, `outcome`, `rounds`, `checked`,
//     `verified`, `retried`, `requeued`, `swept`, `requeued_repeatedly`,
//     `figures` (`pending`, `set_aside`, `oldest_pending`, `unverified`,
//     `due_verifications`, `oldest_unverified`, `capped`)
//   - `status` (each element): `workspace`, `protocol`, `generation`,
//     `enabled`, `baseline_complete`/`_cursor`, `backfill_complete`/`_cursor`,
//     `replay_complete`/`_cursor`, `total`, `accepted`, `verified`,
//     `initially_ready`, `pending`, `oldest_pending`,
//     `oldest_pending_age_seconds`, `unverified`, `oldest_unverified`,
//     `oldest_unverified_age_seconds`, `due_verifications`, `figures_capped`,
//     `set_aside` (`count`, `events`), `dead_letters`, `dead_letters_capped`,
//     `oldest_dead_letter_age_seconds`, `dead_letter_error`, `lifecycle_held`
//     (`holders`: `pid`, `application`; `waiting`, `longest_wait_seconds`), `error`
//   - `views`: the views' names
//   - `set-aside`: `generation`, `set_aside` (`count`, `events`: `history_id`,
//     `event_id`, `history_table`, `reason`, `since`, `next_attempt`,
//     `attempts`), `retried`
//   - `audit`: `generation`, `watermark_revision`, `equal`, `differences`,
//     `repairable`, `in_flight`, `rechecked`, `buckets`, `differing_buckets`,
//     `bucket_digits`, `views` (`view`, `entity_id`, `record_kind`,
//     `source_records`, `warehouse_records`, `differing_buckets`, `in_flight`,
//     `counts`, `differences`: `record_key`, `kind`, `source_revision`,
//     `source_deleted`, `warehouse_revision`, `warehouse_deleted`;
//     `all_listed`)
//   - `repair`: `audit` (as `audit`), `reset`, `reset_verified`, `drain` (as
//     `drain`)
//   - `dead-letter`: `subscription`, `messages`, `complete`,
//     `oldest_dead_lettered`, `oldest_age_seconds`, `events` (`event_id`,
//     `generation`, `entity_id`, `record_key`, `revision`, `copies`, `bytes`,
//     `delivery_attempts`, `first_dead_lettered`, `last_dead_lettered`),
//     `republished`, `discarded`, `not_found`
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := context.WithCancelCause(context.Background())
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-signals
		stop(fmt.Errorf("stopped by %v", sig))
		fmt.Fprintf(os.Stderr, "job: %v: stopping after the current page (again to stop at once)\n", sig)
		<-signals
		fmt.Fprintln(os.Stderr, "job: stopped at once: the pages and batches in flight were rolled back (nothing half-done is kept); everything committed before stays, and running the command again resumes")
		os.Exit(130)
	}()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop(nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "job: "+oneLine(err.Error()))
		os.Exit(exitCode(err))
	}
}

// exitCoder is an error that chooses the job's exit status.
type exitCoder interface{ ExitCode() int }

// exitCode is the job's exit status for a command's error: 2 for a usage
// error, the error's own (`job audit`: 3 when a workspace could not be
// audited and none differed), otherwise 1 (a failure, or `job audit`
// finding a warehouse that differs).
func exitCode(err error) int {
	var usage usageError
	var coder exitCoder
	switch {
	case errors.As(err, &usage):
		return 2
	case errors.As(err, &coder):
		return coder.ExitCode()
	}
	return 1
}
