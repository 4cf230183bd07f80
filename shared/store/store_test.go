package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestRetryable: lock and statement timeouts (which every store transaction
// sets) and lost connections are retryable; protocol errors, and PostgreSQL
// errors with a malformed SQLSTATE, are not.
func TestRetryable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 1)
	pending, err := e.store.PendingEvents(e.ctx, tg)
	require.NoError(t, err)
	ids := pending.IDs()
	st, err := store.New(e.pool, store.Config{LockTimeout: 50 * time.Millisecond, StatementTimeout: 100 * time.Millisecond})
	require.NoError(t, err)

	// Hold the lifecycle lock exclusively: the acknowledgement's shared
	// lock waits, and its lock_timeout ends the wait.
	tx, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(e.ctx) }()
	_, err = tx.Exec(e.ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", store.LifecycleLock)
	require.NoError(t, err)
	_, lockErr := st.Acknowledge(e.ctx, tg, ids)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, lockErr, &pgErr)
	require.Equal(t, "55P03", pgErr.Code, "lock_timeout: %v", lockErr)
	require.NoError(t, tx.Rollback(e.ctx))

	// Hold a delivery row: the acknowledgement's update waits for it, and
	// its statement_timeout (shorter than a lock wait would be otherwise)
	// or lock_timeout ends the wait.
	row, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = row.Rollback(e.ctx) }()
	_, err = row.Exec(e.ctx, "SELECT 1 FROM _ontology_replication_delivery FOR UPDATE")
	require.NoError(t, err)
	_, rowErr := st.Acknowledge(e.ctx, tg, ids)
	require.ErrorAs(t, rowErr, &pgErr)
	require.Contains(t, []string{"55P03", "57014"}, pgErr.Code, "%v", rowErr)

	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"lock timeout", lockErr, true},
		{"row lock wait", rowErr, true},
		{"deadline", context.DeadlineExceeded, true},
		{"connection refused", &pgconn.PgError{Code: "08006"}, true},
		{"statement timeout", &pgconn.PgError{Code: "57014"}, true},
		{"deadlock", &pgconn.PgError{Code: "40P01"}, true},
		{"too many connections (a full Cloud SQL instance)", &pgconn.PgError{Code: "53300"}, true},
		{"out of memory", &pgconn.PgError{Code: "53200"}, true},
		{"system error", &pgconn.PgError{Code: "58000"}, true},
		{"serialization failure", &pgconn.PgError{Code: "40001"}, true},
		{"idle in transaction timeout", &pgconn.PgError{Code: "25P03"}, true},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"lock not available", &pgconn.PgError{Code: "55P03"}, true},
		{"insufficient privilege", &pgconn.PgError{Code: "42501"}, false},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"undefined table", &pgconn.PgError{Code: "42P01"}, false},
		{"empty SQLSTATE", &pgconn.PgError{Code: ""}, false},
		{"one-character SQLSTATE", &pgconn.PgError{Code: "5"}, false},
		{"missing history", store.ErrMissingHistory, false},
		{"plain", errors.New("plain"), false},
		{"nil", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, store.Retryable(c.err))
		})
	}
	_, err = store.New(e.pool, store.Config{LockTimeout: -1})
	require.ErrorContains(t, err, "LockTimeout")
}

// TestDefaultTimeouts: the store's defaults are the SDK lifecycle code's
// (statement 30 s, lock 5 s), and a store built with them waits for a lock
// that long and no less: an acknowledgement behind an exclusive lifecycle
// lock gives up with lock_not_available after at least 5 s.
func TestDefaultTimeouts(t *testing.T) {
	t.Parallel()
	d := store.Defaults()
	require.Equal(t, 30*time.Second, d.StatementTimeout)
	require.Equal(t, 5*time.Second, d.LockTimeout)
	require.Equal(t, time.Minute, d.SetAsideBackoff)
	require.Equal(t, time.Hour, d.SetAsideMaxBackoff)
	require.Equal(t, 15*time.Second, d.IdleTimeout)

	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 1)
	pending, err := e.store.PendingEvents(e.ctx, tg)
	require.NoError(t, err)
	tx, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(e.ctx) }()
	_, err = tx.Exec(e.ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", store.LifecycleLock)
	require.NoError(t, err)
	started := time.Now()
	_, err = e.store.Acknowledge(e.ctx, tg, pending.IDs())
	waited := time.Since(started)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code, "lock_timeout: %v", err)
	require.GreaterOrEqual(t, waited, 5*time.Second, "the default lock timeout is waited out")
}
