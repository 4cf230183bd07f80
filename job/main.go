// Command job is the replication Cloud Run job, and the same binary runs
// locally: backfill, replay, drain, verify, status, views, and local (the
// whole pipeline on embedded parts).
//
//	job <command> [--workspace W] [--generation G] [--json]
//
// Every page is its own transaction and state lives only in the database,
// so a job killed at any moment continues where it stopped when run again.
// SIGINT and SIGTERM stop it after the current page.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "job:", err)
		os.Exit(1)
	}
}
