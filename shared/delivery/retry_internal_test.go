package delivery

import (
	"context"
	"errors"
	"github.com/stretchr/testify/require"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestRetryPolicyValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		p  RetryPolicy
		ok bool
	}{
		{RetryPolicy{}, true},
		{RetryPolicy{Initial: time.Microsecond}, false},
		{RetryPolicy{Initial: time.Second, Max: time.Millisecond}, false},
		{RetryPolicy{Budget: -time.Second}, false},
		{RetryPolicy{Initial: time.Millisecond, Max: time.Millisecond, Budget: time.Second}, true},
	} {
		if err := tc.p.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: Validate() = %v", tc.p, err)
		}
	}
}

// TestRetrying: a transient fault is retried until the step succeeds; a
// fault no retry fixes is returned at once; a transient fault that lasts
// past the budget is returned, saying how long it was retried.
func TestRetrying(t *testing.T) {
	t.Parallel()
	s := &Service{cfg: Config{Retry: RetryPolicy{Initial: time.Millisecond, Max: 2 * time.Millisecond, Budget: 200 * time.Millisecond}},
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	conflict := &pgconn.PgError{Code: "40001"}
	for _, tc := range []struct {
		name     string
		failures int   // how many times the step fails before it succeeds (-1: always)
		err      error // what it fails with
		attempts int   // at least
		wantErr  bool
	}{
		{"transient, then success", 3, conflict, 4, false},
		{"not transient", -1, errors.New("constraint"), 1, true},
		{"transient past the budget", -1, conflict, 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			attempts := 0
			err := s.retrying(context.Background(), "test", "w1", func() error {
				attempts++
				if tc.failures < 0 || attempts <= tc.failures {
					return tc.err
				}
				return nil
			})
			if (err != nil) != tc.wantErr || attempts < tc.attempts {
				t.Fatalf("err %v after %d attempts", err, attempts)
			}
			if tc.name == "not transient" && attempts != 1 {
				t.Fatalf("a fault no retry fixes was retried: %d attempts", attempts)
			}
			if tc.name == "transient past the budget" && !errors.Is(err, conflict) {
				t.Fatalf("the last cause is lost: %v", err)
			}
		})
	}
}

// TestRetryingEndsWithinTheBudget: attempts that each fail only after a
// while (a connect to a silent server) end the step within the budget,
// counted from the first attempt's start, not a budget after its failure
// and an attempt more.
func TestRetryingEndsWithinTheBudget(t *testing.T) {
	t.Parallel()
	const budget, attemptTakes = 600 * time.Millisecond, 250 * time.Millisecond
	s := &Service{cfg: Config{Retry: RetryPolicy{Initial: time.Millisecond, Max: 2 * time.Millisecond, Budget: budget}},
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	started := time.Now()
	attempts := 0
	err := s.retrying(context.Background(), "test", "w1", func() error {
		attempts++
		time.Sleep(attemptTakes) // the connect timeout being waited out
		return &pgconn.PgError{Code: "40001"}
	})
	took := time.Since(started)
	require.Error(t, err)
	require.GreaterOrEqual(t, attempts, 2, "retried while the budget allowed")
	// Each attempt takes attemptTakes at least: the last that started
	// did so with room for one more of its length before the budget.
	require.LessOrEqual(t, time.Duration(attempts)*attemptTakes, budget, "%d attempts of %v: one started that ended past the budget", attempts, attemptTakes)
	t.Logf("%d attempts in %v (budget %v)", attempts, took, budget)
}
