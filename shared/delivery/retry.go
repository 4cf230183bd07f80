package delivery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/googleapis/gax-go/v2"
)

// RetryPolicy bounds the retries of transient faults inside a command (a
// drain batch, a backfill or replay page): Pub/Sub unavailable or out of
// time, a lost or refused database connection, a lock or statement timeout,
// a serialization failure or deadlock, the server's connection budget full
// (see Transient). A step is retried with exponential backoff and jitter
// (gax.Backoff) until it succeeds, fails in a way no retry fixes, or the
// budget has passed since its first failure; then the command fails with
// the last cause. Retrying never re-runs acknowledged work: a batch is
// acknowledged only after Pub/Sub took it, and a retried drain claims what
// is still pending; a page is one transaction, whose cursor moved only if
// it committed. The functions retry nothing themselves: the next wake-up,
// and the verifier's sweep, are their retry.
type RetryPolicy struct {
	// Initial is the first pause. Default: 250ms.
	Initial time.Duration
	// Max bounds one pause. Default: 10s.
	Max time.Duration
	// Budget bounds the time a step keeps being retried, from the start
	// of its first failed attempt; an attempt that would end past it, as
	// long as the last one took, is not started. Default: 2m.
	Budget time.Duration
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	p.Initial = cmp.Or(p.Initial, 250*time.Millisecond)
	p.Max = cmp.Or(p.Max, 10*time.Second)
	p.Budget = cmp.Or(p.Budget, 2*time.Minute)
	return p
}

// Validate reports the first invalid field (a zero field takes its
// default).
func (p RetryPolicy) Validate() error {
	p = p.withDefaults()
	switch {
	case p.Initial < time.Millisecond:
		return fmt.Errorf("Initial %v: must be at least 1ms", p.Initial)
	case p.Max < p.Initial:
		return fmt.Errorf("Max %v: must be at least Initial (%v)", p.Max, p.Initial)
	case p.Budget < 0:
		return fmt.Errorf("Budget %v: must not be negative", p.Budget)
	}
	return nil
}

// retrying runs step, retrying its transient failures under the service's
// RetryPolicy; ctx ends the pauses and the retries (the step itself runs on
// the context its caller gives it). Each retry is logged at WARNING with the
// attempt and the cause.
func (s *Service) retrying(ctx context.Context, operation, workspaceID string, step func() error) error {
	policy := s.cfg.Retry.withDefaults()
	var (
		first, started time.Time
		lastTook       time.Duration
		attempt        int
	)
	// A step cancelled from outside (the command interrupted, or a sibling
	// drain failed) is not retried: only its own faults are.
	retryable := func(err error) bool { return Transient(err) && !errors.Is(err, context.Canceled) }
	retryer := gax.OnErrorFunc(gax.Backoff{Initial: policy.Initial, Max: policy.Max, Multiplier: 2}, retryable)
	err := gax.Invoke(ctx, func(context.Context, gax.CallSettings) error {
		attempt++
		started = time.Now()
		err := step()
		lastTook = time.Since(started)
		return err
	}, gax.WithRetry(func() gax.Retryer {
		return retryerFunc(func(err error) (time.Duration, bool) {
			pause, ok := retryer.Retry(err)
			// The budget counts from the start of the first failed attempt
			// (a connection to a silent server fails only at its connect
			// timeout), and no attempt starts that would end past it if it
			// took as long as the last: a command facing a silent database
			// ends within its budget, not a budget and two connects later.
			if first.IsZero() {
				first = started
			}
			if !ok || time.Since(first)+pause+lastTook > policy.Budget {
				return 0, false
			}
			s.log.WarnContext(ctx, "replication: a transient fault; retrying",
				slog.String("operation", operation), slog.String("workspace", workspaceID), slog.Int("attempt", attempt),
				slog.Float64("retry_in_seconds", pause.Seconds()), slog.String("cause", err.Error()))
			return pause, true
		})
	}))
	if err != nil && attempt > 1 && Transient(err) && ctx.Err() == nil {
		return fmt.Errorf("%s: still failing after %d attempts over %v: %w", operation, attempt, time.Since(first).Round(time.Millisecond), err)
	}
	return err
}

// retryerFunc is a gax.Retryer.
type retryerFunc func(err error) (time.Duration, bool)

func (f retryerFunc) Retry(err error) (time.Duration, bool) { return f(err) }
