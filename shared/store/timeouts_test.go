package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestEveryTransactionBoundsItsWaits: every statement path of the store
// sets lock_timeout and statement_timeout for itself (the role's and the
// database's defaults are none), as the SDK's transactions do. With the
// replication tables locked by a transaction of the test's own, each
// operation must end with PostgreSQL's own error — lock_not_available
// (55P03) when the lock timeout is the shorter, query_canceled (57014)
// when the statement timeout is — within moments, never wait for the
// caller's deadline.
func TestEveryTransactionBoundsItsWaits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	var claim *store.Claim // taken before each bound's lock, finished under it
	var historyIDs []string
	operations := []struct {
		name string
		run  func(ctx context.Context, st *store.Store) error
	}{
		{"State", func(ctx context.Context, st *store.Store) error { _, err := st.State(ctx); return err }},
		{"ActiveTarget", func(ctx context.Context, st *store.Store) error { _, _, err := st.ActiveTarget(ctx); return err }},
		{"Target", func(ctx context.Context, st *store.Store) error { _, err := st.Target(ctx, tg.Generation); return err }},
		{"ClaimActive", func(ctx context.Context, st *store.Store) error { _, _, _, err := st.ClaimActive(ctx); return err }},
		{"Claim", func(ctx context.Context, st *store.Store) error { _, err := st.Claim(ctx, tg); return err }},
		{"PendingEvents", func(ctx context.Context, st *store.Store) error { _, err := st.PendingEvents(ctx, tg); return err }},
		{"Acknowledge", func(ctx context.Context, st *store.Store) error {
			_, err := st.Acknowledge(ctx, tg, historyIDs)
			return err
		}},
		{"Claim.Finish", func(ctx context.Context, st *store.Store) error {
			_, err := claim.Finish(ctx, nil, []store.SetAside{{HistoryID: historyIDs[0], Reason: store.ReasonRejected}})
			return err
		}},
		{"ReadSetAside", func(ctx context.Context, st *store.Store) error {
			_, err := st.ReadSetAside(ctx, tg, 10, 1000)
			return err
		}},
		{"RetrySetAside", func(ctx context.Context, st *store.Store) error { _, err := st.RetrySetAside(ctx, tg); return err }},
		{"DueUnverified", func(ctx context.Context, st *store.Store) error { _, err := st.DueUnverified(ctx, tg); return err }},
		{"VerifyEvents", func(ctx context.Context, st *store.Store) error {
			_, err := st.VerifyEvents(ctx, tg, historyIDs)
			return err
		}},
		{"RetryUnverified", func(ctx context.Context, st *store.Store) error {
			_, err := st.RetryUnverified(ctx, tg, historyIDs)
			return err
		}},
		{"Status", func(ctx context.Context, st *store.Store) error { _, err := st.Status(ctx, tg); return err }},
		{"Figures", func(ctx context.Context, st *store.Store) error { _, err := st.Figures(ctx, tg); return err }},
		{"InitiallyReady", func(ctx context.Context, st *store.Store) error { _, err := st.InitiallyReady(ctx, tg); return err }},
		{"AdvanceBackfill", func(ctx context.Context, st *store.Store) error { _, err := st.AdvanceBackfill(ctx, tg); return err }},
		{"InitReplay", func(ctx context.Context, st *store.Store) error { return st.InitReplay(ctx, tg) }},
		{"AdvanceReplay", func(ctx context.Context, st *store.Store) error { _, err := st.AdvanceReplay(ctx, tg); return err }},
		{"ReplayUndrained", func(ctx context.Context, st *store.Store) error { _, err := st.ReplayUndrained(ctx, tg); return err }},
	}

	for _, bound := range []struct {
		name          string
		cfg           store.Config
		code          string
		within, after time.Duration
	}{
		{"lock_timeout", store.Config{LockTimeout: 150 * time.Millisecond, StatementTimeout: time.Minute}, "55P03", 5 * time.Second, 150 * time.Millisecond},
		{"statement_timeout", store.Config{LockTimeout: time.Minute, StatementTimeout: 150 * time.Millisecond}, "57014", 5 * time.Second, 150 * time.Millisecond},
	} {
		t.Run(bound.name, func(t *testing.T) {
			// A pool of its own: no connection of it sets either timeout
			// for the session, and none prepares a batch's statements in
			// a round of its own before the batch's first statement has
			// set them (pgx's statement cache does, on a connection's
			// first use of a statement: that wait is bounded by the
			// session's timeouts, see the database package).
			cfg := e.pool.Config().Copy()
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
			pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
			require.NoError(t, err)
			defer pool.Close()
			st, err := store.New(pool, bound.cfg)
			require.NoError(t, err)
			e.products(t, 2)
			claim = e.claimOf(t, st, tg)
			historyIDs = claim.IDs()
			defer claim.Release(e.ctx)

			// The lock: every replication table, in a transaction of the
			// test's own.
			lock, err := e.pool.Begin(e.ctx)
			require.NoError(t, err)
			defer func() { _ = lock.Rollback(context.Background()) }()
			_, err = lock.Exec(e.ctx, `LOCK TABLE _ontology_replication, _ontology_replication_targets, _ontology_replication_delivery,
				_ontology_replication_receipts, _ontology_replication_baselines IN ACCESS EXCLUSIVE MODE`)
			require.NoError(t, err)
			for _, op := range operations {
				t.Run(op.name, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(e.ctx, bound.within)
					defer cancel()
					started := time.Now()
					err := op.run(ctx, st)
					elapsed := time.Since(started)
					var pgErr *pgconn.PgError
					require.True(t, errors.As(err, &pgErr), "%s waited for the caller's deadline (%v): %v", op.name, elapsed, err)
					require.Equal(t, bound.code, pgErr.Code, "%s: %v", op.name, err)
					require.GreaterOrEqual(t, elapsed, bound.after)
				})
			}
		})
	}
}
