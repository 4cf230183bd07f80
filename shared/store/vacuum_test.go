package store_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"log/slog"
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

	// A role that does not own the table (PostgreSQL 15 has no MAINTAIN
	// privilege) may not VACUUM it: the store says so once, in its log,
	// runs no VACUUM, and the replay completes all the same.
	role := "novacuum_" + strings.ReplaceAll(rand.Text(), "=", "")
	password := rand.Text()
	e.exec(t, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN PASSWORD '"+password+"'")
	t.Cleanup(func() {
		_, _ = e.pool.Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{role}.Sanitize())
		_, _ = e.pool.Exec(context.Background(), "DROP ROLE "+pgx.Identifier{role}.Sanitize())
	})
	e.exec(t, "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "+pgx.Identifier{role}.Sanitize())
	e.exec(t, "GRANT SELECT, USAGE ON ALL SEQUENCES IN SCHEMA public TO "+pgx.Identifier{role}.Sanitize())
	limited := cfg.Copy()
	limited.ConnConfig.User, limited.ConnConfig.Password = role, password
	vacuums.n.Store(0)
	pool2, err := pgxpool.NewWithConfig(e.ctx, limited)
	require.NoError(t, err)
	defer pool2.Close()
	var logs bytes.Buffer
	st2, err := store.New(pool2, store.Config{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	require.NoError(t, err)
	require.NoError(t, st2.InitReplay(e.ctx, tg))
	for {
		page, err := st2.AdvanceReplay(e.ctx, tg)
		require.NoError(t, err)
		if page.Complete {
			break
		}
	}
	require.Zero(t, vacuums.n.Load(), "no VACUUM the role may not run")
	require.Equal(t, 1, strings.Count(logs.String(), "this role may not VACUUM _ontology_replication_targets"), logs.String())
	require.Contains(t, logs.String(), `"level":"WARN"`)
}
