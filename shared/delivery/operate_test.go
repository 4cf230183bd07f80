package delivery_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/logbuf"
)

// TestReadsRideOutATransientFault: the operator's reads (status, the
// set-aside list, views, audit) retry a transient fault under the
// command's retry policy, as the drains and pages do: here a lock timeout
// behind a migration that holds the replication singleton, released after
// the first failure.
func TestReadsRideOutATransientFault(t *testing.T) {
	t.Parallel()
	var logs logbuf.Buffer
	r := newRig(t, 2, withStore(store.Config{LockTimeout: 200 * time.Millisecond}), withService(func(c *delivery.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		c.Retry = delivery.RetryPolicy{Initial: 50 * time.Millisecond}
	}))
	reads := []struct {
		name string
		read func(ctx context.Context) error
	}{
		{"status", func(ctx context.Context) error { _, err := r.svc.Status(ctx, "w1", "", 10); return err }},
		{"set-aside", func(ctx context.Context) error { _, err := r.svc.SetAsideEvents(ctx, "w1", 10, false); return err }},
	}
	for _, rd := range reads {
		t.Run(rd.name, func(t *testing.T) {
			migration, err := r.pool.Begin(r.ctx)
			require.NoError(t, err)
			defer func() { _ = migration.Rollback(r.ctx) }()
			_, err = migration.Exec(r.ctx, `LOCK TABLE _ontology_replication IN ACCESS EXCLUSIVE MODE`)
			require.NoError(t, err)
			before := strings.Count(logs.String(), "a transient fault; retrying")
			done := make(chan error, 1)
			go func() { done <- rd.read(r.ctx) }()
			for strings.Count(logs.String(), "a transient fault; retrying") == before {
				select {
				case err := <-done:
					t.Fatalf("the read ended before it met the lock: %v", err)
				case <-time.After(10 * time.Millisecond): // the log line is the signal
				}
			}
			require.NoError(t, migration.Rollback(r.ctx))
			require.NoError(t, <-done, "the retry after the migration succeeds")
		})
	}
}
