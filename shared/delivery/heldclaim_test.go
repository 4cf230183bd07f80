package delivery_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/logbuf"
)

// TestACommitHeldByAnotherClaimIsNotLeftToIt: a drainer finds its commits
// held by another session's claim and takes nothing. That claim may never
// publish them: its session is ending (the client closed it and the server
// has not yet let its locks go), or its instance froze and the server ends
// it later, or it lets them go unpublished. The drainer looks again after a
// backoff and publishes them once the claim has ended; leaving them to the
// claim would strand a commit whose wake-up was answered 2xx (SPEC §3)
// until the next wake-up or the sweep. On a quiet workspace and a busy one
// (through the turns).
func TestACommitHeldByAnotherClaimIsNotLeftToIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, workspace, end string
	}{
		{"quiet, the claim's session ended", "quiet", "terminate"},
		{"quiet, the claim let go unpublished", "quiet", "unlock"},
		{"busy, the claim's session ended", "busy", "terminate"},
		{"busy, the claim let go unpublished", "busy", "unlock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs logbuf.Buffer
			r := newRig(t, 2, withService(func(c *delivery.Config) {
				c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
				c.QuietInterval = -1 // every claim takes turns
				if tc.workspace == "quiet" {
					c.QuietInterval = time.Hour // every claim on its own
				}
			}))
			for i := range 3 {
				_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "held", "stock": int64(i)})
				require.NoError(t, err)
			}
			holder, held := r.holdClaimLocks(t)
			require.EqualValues(t, 3, held)
			r.wakeOK(t, r.svc)
			awaitLogged(t, &logs, delivery.LogDrainHeld, (<-chan struct{})(nil), "the drainer whose 3 commits another claim held")
			switch tc.end {
			case "terminate":
				r.count(t, `SELECT count(*) FROM pg_terminate_backend($1) WHERE true`, holder.PgConn().PID())
			case "unlock":
				_, err := holder.Exec(r.ctx, `SELECT pg_advisory_unlock_all()`)
				require.NoError(t, err)
			}
			r.settle(t)
			require.Zero(t, r.pendingCount(t), "the drainer ended: its commits may not be pending")
		})
	}
}

// holdClaimLocks holds, on a session of its own, the claim locks of every
// pending event of w1, as another instance's claim does, and returns the
// session and how many it holds.
func (r *rig) holdClaimLocks(t *testing.T) (*pgx.Conn, int64) {
	t.Helper()
	conn, err := pgx.Connect(r.ctx, r.url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(r.ctx) })
	var held int64
	require.NoError(t, conn.QueryRow(r.ctx, `SELECT count(*) FILTER (WHERE pg_try_advisory_lock(hashtext($1), hashtext(event_id::text)))
		FROM _ontology_replication_delivery WHERE accepted_at IS NULL`, store.ClaimLockClass).Scan(&held))
	return conn, held
}
