package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestAuditMarkWaitsForOpenWriters: an SDK write that took its revision
// before the watermark was read and has not committed holds the audit back
// (its event must be read by the audit's source pages); an open transaction
// that wrote nothing does not; and a writer that outlasts the fence's bound
// fails the audit with ErrAuditFence, naming the backends.
func TestAuditMarkWaitsForOpenWriters(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 2)

	// A reader idle in its transaction, with no transaction id: no wait.
	reader, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = reader.Rollback(e.ctx) }()
	_, err = reader.Exec(e.ctx, `SELECT count(*) FROM _ontology_replication_delivery`)
	require.NoError(t, err)
	quick, err := store.New(e.pool, store.Config{AuditFenceTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	_, err = quick.AuditMark(e.ctx, tg)
	require.NoError(t, err, "an open transaction that wrote nothing is not waited for")

	// An SDK write holding its revision, uncommitted.
	took := make(chan int64)
	commit := make(chan struct{})
	release := sync.OnceFunc(func() { close(commit) })
	defer release() // a failing test lets the writer end
	written := make(chan error, 1)
	go func() {
		written <- e.w.Commit(e.ctx, func(c *sdkfixture.Change) error {
			if _, err := c.Create("product", map[string]any{"title": "late"}); err != nil {
				return err
			}
			var revision int64
			if err := c.Tx().QueryRow(e.ctx, `SELECT last_value FROM _ontology_replication_revision`).Scan(&revision); err != nil {
				return err
			}
			took <- revision
			<-commit
			return nil
		})
	}()
	revision := await.Receive(t, took, "took")

	_, err = quick.AuditMark(e.ctx, tg)
	require.ErrorIs(t, err, store.ErrAuditFence, "the writer outlasts the fence's bound")
	require.Contains(t, err.Error(), "backend pids")

	marked := make(chan store.AuditMark, 1)
	failed := make(chan error, 1)
	go func() {
		m, err := e.store.AuditMark(e.ctx, tg)
		if err != nil {
			failed <- err
			return
		}
		marked <- m
	}()
	// The fence is waiting: its poll runs while the writer is open.
	waitForQuery(t, e, "virtualxid = ANY")
	select {
	case m := <-marked:
		t.Fatalf("the watermark %d was returned while a writer of revision %d was open", m.Revision, revision)
	case err := <-failed:
		t.Fatal(err)
	default:
	}
	release()
	require.NoError(t, await.Receive(t, written, "written"))
	select {
	case m := <-marked:
		require.GreaterOrEqual(t, m.Revision, revision)
	case err := <-failed:
		t.Fatal(err)
	}
}

// waitForQuery waits until a backend of the database other than the
// test's runs or has last run a statement containing what.
func waitForQuery(t testing.TB, e *env, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	for {
		var n int
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND pid <> pg_backend_pid() AND query LIKE '%' || $1 || '%' AND query NOT LIKE '%pg_stat_activity%'`, what).Scan(&n))
		if n > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no statement containing %q ran", what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestAuditMarkWaitsOnlyForItsOwnDatabase: a Cloud SQL instance holds many
// workspaces' databases; an SDK write open in another database of the
// server (its lifecycle lock and its revision taken, uncommitted) does not
// hold back an audit of this one.
func TestAuditMarkWaitsOnlyForItsOwnDatabase(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 2)
	other := newEnv(t, &sdkfixture.V4Template)
	other.start(t)

	took := make(chan struct{})
	commit := make(chan struct{})
	release := sync.OnceFunc(func() { close(commit) })
	defer release()
	written := make(chan error, 1)
	go func() {
		written <- other.w.Commit(other.ctx, func(c *sdkfixture.Change) error {
			if _, err := c.Create("product", map[string]any{"title": "open elsewhere"}); err != nil {
				return err
			}
			close(took)
			<-commit
			return nil
		})
	}()
	await.Receive(t, took, "the other database's writer")

	quick, err := store.New(e.pool, store.Config{AuditFenceTimeout: 500 * time.Millisecond})
	require.NoError(t, err)
	_, err = quick.AuditMark(e.ctx, tg)
	require.NoError(t, err, "a writer open in another database of the server is not waited for")
	release()
	require.NoError(t, await.Receive(t, written, "written"))
}
