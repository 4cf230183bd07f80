package sandbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/segmentstream/ontology-replication/shared/logging"
)

// Open starts every part of a sandbox with cfg and returns it running;
// the caller closes it (Close). Its logs are quiet unless LOG_LEVEL (read
// with getenv) asks for them on stderr, where its live line goes too; what
// a command prints goes to stdout.
func Open(ctx context.Context, cfg Config, getenv func(string) string, stdout, stderr io.Writer) (*Local, error) {
	// Quiet by default: the command's summary says what happened (an
	// injected outage alone makes a hundred 503s).
	level := slog.LevelError + 4
	if raw := getenv("LOG_LEVEL"); raw != "" {
		var err error
		if level, err = logging.ParseLevel(raw); err != nil {
			return nil, fmt.Errorf("LOG_LEVEL: %w", err)
		}
	}
	l := &Local{Config: cfg, Log: logging.New(stderr, logging.Config{Level: level}), Out: stdout, logLevel: level.String(), logs: io.Discard}
	if getenv("LOG_LEVEL") != "" {
		l.logs = stderr
	}
	l.Progress = newProgress(stderr, l)
	l.Progress.Commits = l.Commits.Load
	l.Progress.Enter("starting PostgreSQL, Pub/Sub, the local warehouse and the functions", "")
	if err := l.start(ctx); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// ShowProgress draws the live line until stop is called; stop returns
// once the line's last draw is done.
func (l *Local) ShowProgress(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); l.Progress.run(ctx) }()
	return func() {
		cancel()
		<-done
	}
}
