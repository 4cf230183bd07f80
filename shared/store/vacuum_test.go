package store_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// vacuumCounter counts the VACUUM statements a pool ran to their end
// without error.
type vacuumCounter struct{ n atomic.Int64 }

type vacuumKey struct{}

func (v *vacuumCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, vacuumKey{}, strings.HasPrefix(data.SQL, "VACUUM"))
}

func (v *vacuumCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if vacuum, _ := ctx.Value(vacuumKey{}).(bool); vacuum && data.Err == nil {
		v.n.Add(1)
	}
}

// TestPagesVacuumTheTargetTable advances replay pages and counts the
// store's VACUUMs of the target table as each page returns: none before
// the TargetVacuumEvery-th page, one right after it (the page's own call
// runs it, synchronously), and the replay still completes. (The server's
// own statistics arrive up to a second late: waiting on them was a sleep.)
func TestPagesVacuumTheTargetTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	require.NoError(t, sdkfixture.BulkCreate(e.ctx, e.pool, sdkfixture.Demo, "product", "title", store.TargetVacuumEvery*store.ReplayPageSize, 10_000))
	var vacuums vacuumCounter
	cfg := e.pool.Config().Copy()
	cfg.ConnConfig.Tracer = &vacuums
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	st, err := store.New(pool, store.Config{})
	require.NoError(t, err)

	require.NoError(t, st.InitReplay(e.ctx, tg))
	pages := 0
	for {
		page, err := st.AdvanceReplay(e.ctx, tg)
		require.NoError(t, err)
		if page.Rows > 0 {
			pages++
		}
		want := int64(0)
		if pages >= store.TargetVacuumEvery {
			want = 1
		}
		require.Equal(t, want, vacuums.n.Load(), "VACUUMs after %d pages", pages)
		if page.Complete {
			break
		}
	}
	require.Equal(t, store.TargetVacuumEvery, pages)
	require.EqualValues(t, 1, e.count(t, "SELECT count(*) FROM _ontology_replication_targets WHERE replay_complete"))
}
