// Command local runs the whole replication pipeline on this machine with no
// cloud account: a throwaway PostgreSQL with the SDK's schema, an in-process
// Pub/Sub, a local warehouse standing in for BigQuery, and the Drain and
// Verify functions on localhost, driven by a workload of SDK commits.
//
//	go run ./job/local [--records N] [--writers N] [--json] [--keep]
//	go run ./job/local --chaos DURATION [--seed N] [--rate N] [--json]
//
// It is a demonstration and a test bench: it is never deployed, and the
// deployed job (./job) links none of it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runLocal(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, strings.Join(strings.Fields(err.Error()), " "))
		if errors.As(err, new(usageError)) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is a mistake in the command line: the local mode exits 2.
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
