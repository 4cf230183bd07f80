package delivery

import (
	"context"
	"errors"
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
