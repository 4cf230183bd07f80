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
// machine, is its own command: go run ./job/local.
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
