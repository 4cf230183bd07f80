package delivery_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
	"github.com/segmentstream/ontology-replication/shared/testbench/localwarehouse"
	"github.com/segmentstream/ontology-replication/shared/testbench/logbuf"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// auditRig is a workspace whose warehouse is perfect: the BigQuery
// client's audit queries are answered (through bqserver and the local
// warehouse's SQL) from a view over the source's committed history, so
// every event is in the warehouse the moment its transaction commits, and
// every delivery row is verified as it is queued. An audit of it must find
// nothing, whatever the writers do.
type auditRig struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	w       *sdkfixture.Writer
	svc     *delivery.Service
	auditor *flakyAuditor
}

func newAuditRig(t *testing.T, cfg store.Config, opts ...func(*delivery.Config)) *auditRig {
	t.Helper()
	ctx := context.Background()
	url := pgtest.NewDatabase(t, &sdkfixture.V4Template)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	gen, err := sdkfixture.StartGeneration(ctx, pool, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE SCHEMA wh`)
	require.NoError(t, err)
	wh, err := localwarehouse.Open(ctx, url+"&search_path=wh")
	require.NoError(t, err)
	t.Cleanup(wh.Close)
	for _, q := range []string{
		`DROP TABLE wh.events`,
		fmt.Sprintf(`CREATE VIEW wh.events AS
		   SELECT id::text AS event_id, replication->>'source_id' AS source_id, %[1]s::text AS generation,
		          replication->>'entity_id' AS entity_id, replication->>'record_key' AS record_key,
		          replication->>'record_kind' AS record_kind, replication->>'schema_hash' AS schema_hash,
		          (replication->>'revision')::numeric AS revision, (replication->>'deleted')::boolean AS deleted,
		          (replication->>'payload')::jsonb AS payload, now() AS ingested_at
		     FROM public.product_history WHERE replication IS NOT NULL`, "'"+gen.Generation+"'"),
		`CREATE FUNCTION wh.verified() RETURNS trigger LANGUAGE plpgsql AS $$
		   BEGIN NEW.accepted_at := now(); NEW.verified_at := now(); RETURN NEW; END $$`,
		`CREATE TRIGGER verified BEFORE INSERT ON public._ontology_replication_delivery FOR EACH ROW EXECUTE FUNCTION wh.verified()`,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	bq := httptest.NewServer(bqserver.New(wh.QueryHandler()))
	t.Cleanup(bq.Close)
	reg, err := registry.Parse(fmt.Appendf(nil, `{"workspaces": [{"id": "w1", "database": {"url": %q},
		"pubsub": {"project": "p1", "topic": "events"}, "bigquery": {"project": "p1", "endpoint": %q}}]}`, url, bq.URL))
	require.NoError(t, err)
	pools, err := database.New(database.Config{})
	require.NoError(t, err)
	t.Cleanup(pools.Close)
	bqc, err := warehouse.NewBigQuery(warehouse.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = bqc.Close() })
	r := &auditRig{ctx: ctx, pool: pool, w: sdkfixture.NewWriter(pool, sdkfixture.Demo), auditor: &flakyAuditor{BigQuery: bqc}}
	c := delivery.Config{Registry: reg, Pools: pools, Publisher: noPublisher{}, Auditor: r.auditor, Store: cfg,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, o := range opts {
		o(&c)
	}
	r.svc, err = delivery.New(c)
	require.NoError(t, err)
	return r
}

// flakyAuditor is the BigQuery client, whose records reads can be told to
// leave out a record, as a warehouse that lost it (or a read that missed
// it) would.
type flakyAuditor struct {
	*warehouse.BigQuery
	mu    sync.Mutex
	key   string
	times int // how many more records reads leave key out
	// For hides key from the reads within span of the first read that
	// missed it (hideFor), as a record that lands a moment later.
	span     time.Duration
	hiddenAt time.Time
}

// hideFor makes the records reads leave out key for d from the first one.
func (a *flakyAuditor) hideFor(key string, d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.key, a.times, a.span, a.hiddenAt = key, 0, d, time.Time{}
}

// hide makes the next n records reads leave out the record key.
func (a *flakyAuditor) hide(key string, n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.key, a.times, a.span = key, n, 0
}

func (a *flakyAuditor) AuditRecords(ctx context.Context, table registry.BigQuery, q warehouse.AuditQuery, buckets, keys []string) ([]warehouse.AuditRecord, error) {
	records, err := a.BigQuery.AuditRecords(ctx, table, q, buckets, keys)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.span > 0 && a.hiddenAt.IsZero() {
		a.hiddenAt = time.Now()
	}
	if a.times > 0 || (a.span > 0 && time.Since(a.hiddenAt) < a.span) {
		a.times = max(a.times-1, 0)
		records = slices.DeleteFunc(records, func(r warehouse.AuditRecord) bool { return r.Key == a.key })
	}
	return records, err
}

// products creates n products and returns their ids.
func (r *auditRig) products(t *testing.T, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		id, err := r.w.Create(r.ctx, "product", map[string]any{"title": fmt.Sprintf("p%d", i), "stock": int64(i)})
		require.NoError(t, err)
		ids[i] = id
	}
	return ids
}

// TestAuditIsQuietBesideLateCommits: SDK writers that hold 20 ms between
// taking their revision and committing never make an audit of a perfect
// warehouse report a difference. Without the watermark's fence, a writer
// that took a revision below the watermark and committed after the page
// that would have read it was missing from the source's read while its
// event was in the warehouse: newer_than_source, exit 1, a page.
func TestAuditIsQuietBesideLateCommits(t *testing.T) {
	t.Parallel()
	r := newAuditRig(t, store.Config{AuditPageEvents: 20})
	ids := r.products(t, 40)

	stop := make(chan struct{})
	var writers sync.WaitGroup
	var writes atomic.Int64
	for w := range 4 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := ids[w*10+i%10]
				err := r.w.Commit(r.ctx, func(c *sdkfixture.Change) error {
					if err := c.Update("product", id, map[string]any{"stock": int64(i)}); err != nil {
						return err
					}
					_, err := c.Tx().Exec(r.ctx, `SELECT pg_sleep(0.02)`) // the revision is taken; the commit comes later
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
				writes.Add(1)
			}
		}()
	}
	defer func() { close(stop); writers.Wait() }()

	for i := range 30 {
		rep, err := r.svc.Audit(r.ctx, "w1", delivery.AuditOptions{Entities: []string{"product"}})
		require.NoError(t, err)
		require.Zero(t, rep.Differences, "audit %d after %d writes found differences in a perfect warehouse: %+v", i, writes.Load(), rep.Views)
	}
	require.Positive(t, writes.Load())
}

// TestAuditReportsOnlyWhatARecheckConfirms: a difference the first look
// finds and a second look, after RecheckAfter, does not is not reported;
// one the second look also finds is; without a recheck the first look is
// the report.
func TestAuditReportsOnlyWhatARecheckConfirms(t *testing.T) {
	t.Parallel()
	r := newAuditRig(t, store.Config{})
	key := r.products(t, 5)[2]
	for _, tc := range []struct {
		name                   string
		recheck                time.Duration
		hidden                 int // records reads that miss the record
		hiddenFor              time.Duration
		differences, rechecked int64
	}{
		{"gone at the second look", 10 * time.Millisecond, 1, 0, 0, 1},
		{"confirmed", 10 * time.Millisecond, 2, 0, 1, 1},
		{"no recheck", 0, 1, 0, 1, 0},
		// The record lands half a second after the first look: a second
		// look taken at once would confirm it missing.
		{"landed before the recheck", time.Second, 0, 500 * time.Millisecond, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r.auditor.hide(key, tc.hidden)
			if tc.hiddenFor > 0 {
				r.auditor.hideFor(key, tc.hiddenFor)
			}
			rep, err := r.svc.Audit(r.ctx, "w1", delivery.AuditOptions{Entities: []string{"product"}, Records: []string{key}, RecheckAfter: tc.recheck})
			require.NoError(t, err)
			require.Equal(t, tc.differences, rep.Differences)
			require.Equal(t, tc.rechecked, rep.Rechecked)
			require.Equal(t, tc.differences == 0, rep.Equal)
			if tc.differences > 0 {
				require.Equal(t, delivery.DifferenceMissing, rep.Views[0].Differences[0].Kind)
				require.Equal(t, key, rep.Views[0].Differences[0].RecordKey)
			}
		})
	}
}

// TestAuditRidesOutATransientFault: the audit, a read, retries a transient
// fault under the command's retry policy, as status and the set-aside
// list do (TestReadsRideOutATransientFault): here a lock timeout behind a
// migration that holds the replication singleton, released after the
// first failure.
func TestAuditRidesOutATransientFault(t *testing.T) {
	t.Parallel()
	var logs logbuf.Buffer
	r := newAuditRig(t, store.Config{LockTimeout: 200 * time.Millisecond}, func(c *delivery.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		c.Retry = delivery.RetryPolicy{Initial: 50 * time.Millisecond}
	})
	r.products(t, 3)
	migration, err := r.pool.Begin(r.ctx)
	require.NoError(t, err)
	defer func() { _ = migration.Rollback(r.ctx) }()
	_, err = migration.Exec(r.ctx, `LOCK TABLE _ontology_replication IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		rep, err := r.svc.Audit(r.ctx, "w1", delivery.AuditOptions{Entities: []string{"product"}})
		if err == nil && !rep.Equal {
			err = fmt.Errorf("the audit differs: %+v", rep.Views)
		}
		done <- err
	}()
	awaitLogged(t, &logs, "a transient fault; retrying", done, "the audit (meeting the migration's lock)")
	require.NoError(t, migration.Rollback(r.ctx))
	require.NoError(t, await.Receive(t, done, "the audit"), "the retry after the migration succeeds")
}
