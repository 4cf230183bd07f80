package sandbox

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// UsageError is a mistake in a sandbox command's line: the command exits 2.
type UsageError struct{ error }

// Usagef returns a UsageError that says what was wrong.
func Usagef(format string, args ...any) error {
	return UsageError{fmt.Errorf(format, args...)}
}

func (u UsageError) Unwrap() error { return u.error }

// Main runs a sandbox command's run with its command line, environment and
// standard streams until it returns or SIGINT or SIGTERM ends it, prints
// its error on one line, and exits 2 on a UsageError and 1 on any other.
func Main(run func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return
	}
	fmt.Fprintln(os.Stderr, strings.Join(strings.Fields(err.Error()), " "))
	if errors.As(err, new(UsageError)) {
		os.Exit(2)
	}
	os.Exit(1)
}
