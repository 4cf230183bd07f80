package delivery_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/logbuf"
)

// ledger is the test's own record of what Pub/Sub accepted and of the
// batches out at any moment: a publisher wrapper sees every request.
type ledger struct {
	delivery.Publisher
	published sync.Map // event id → true, once a publish carrying it succeeded
	mu        sync.Mutex
	out       map[string]int // event id → publishes of it in flight
	overlaps  atomic.Int64   // an event in two publishes at once: claimed twice
}

func (l *ledger) Publish(ctx context.Context, topic string, data [][]byte) ([]string, error) {
	ids := make([]string, len(data))
	for i, d := range data {
		var ev struct {
			EventID string `json:"event_id"`
		}
		if err := json.Unmarshal(d, &ev); err != nil {
			return nil, err
		}
		ids[i] = ev.EventID
	}
	l.mu.Lock()
	for _, id := range ids {
		if l.out[id] > 0 {
			l.overlaps.Add(1)
		}
		l.out[id]++
	}
	l.mu.Unlock()
	res, err := l.Publisher.Publish(ctx, topic, data)
	if err == nil {
		for _, id := range ids {
			l.published.Store(id, true)
		}
	}
	l.mu.Lock()
	for _, id := range ids {
		l.out[id]--
	}
	l.mu.Unlock()
	return res, err
}

// present is BigQuery's view: what Pub/Sub accepted has landed.
func (l *ledger) present(ids []string) []string {
	var out []string
	for _, id := range ids {
		if _, ok := l.published.Load(id); ok {
			out = append(out, id)
		}
	}
	return out
}

// refuser makes Pub/Sub refuse, while on, every request that carries a
// message of a product titled "refused-…": events one drain after another
// sets aside.
type refuser struct{ on atomic.Bool }

func (r *refuser) React(req any) (bool, any, error) {
	if !r.on.Load() {
		return false, nil, nil
	}
	for _, m := range req.(*pubsubpb.PublishRequest).Messages {
		if strings.Contains(string(m.Data), `refused-`) {
			return true, nil, status.Error(codes.InvalidArgument, "refused by the test")
		}
	}
	return false, nil, nil
}

// stressDuration is how long TestStress loads the workspace:
// REPLICATION_STRESS (a Go duration; the audit's stress ran 200s), or a
// few seconds in the suite.
// drainersPublished sums what the drainers' lines say they published, and
// counts their faults of a turn held past the wait's bound.
func drainersPublished(t *testing.T, logs *logbuf.Buffer) (published, turnWaits int64) {
	t.Helper()
	for line := range strings.SplitSeq(logs.String(), "\n") {
		if line == "" {
			continue
		}
		var l struct {
			Msg   string `json:"msg"`
			Count int64  `json:"count"`
			Cause string `json:"cause"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &l), line)
		switch {
		case l.Msg == delivery.LogDrainRun:
			published += l.Count
		case l.Msg == delivery.LogDrainFault && l.Cause == delivery.CauseTurnHeld:
			turnWaits++
		}
	}
	return published, turnWaits
}

func stressDuration(t *testing.T) time.Duration {
	t.Helper()
	if v := os.Getenv("REPLICATION_STRESS"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "REPLICATION_STRESS")
		return d
	}
	return 6 * time.Second
}

// TestStress runs everything that touches the queue at once on one
// workspace — four drains on two instances, two SDK writers, whole and
// partial replays, a verifier, events Pub/Sub refuses (set aside) and
// VACUUM — and then, the load stopped, delivers the rest and checks the
// invariants: no event acknowledged that Pub/Sub did not accept, none in
// two publishes at once (claimed twice), no deadlock, and in the end every
// event accepted, verified and counted, with a receipt exactly where it
// is accepted. Run it longer with REPLICATION_STRESS=200s.
func TestStress(t *testing.T) {
	t.Parallel()
	l := &ledger{out: map[string]int{}}
	ref := &refuser{}
	var logs logbuf.Buffer
	r := newRig(t, 4, withPublishReactor(ref), withPresent(l.present),
		withPublisher(func(p delivery.Publisher) delivery.Publisher { l.Publisher = p; return l }),
		withStore(store.Config{LockTimeout: 2 * time.Second}),
		withService(func(c *delivery.Config) { c.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) }))
	instances := []*delivery.Service{r.svc, r.newService()}
	ctx, stop := context.WithTimeout(r.ctx, stressDuration(t))
	defer stop()
	ref.on.Store(true)

	var deadlocks, failures atomic.Int64
	var counts sync.Map // what each kind of worker did
	note := func(kind string, err error) {
		var pgErr *pgconn.PgError
		switch {
		case err == nil, ctx.Err() != nil:
		case errors.As(err, &pgErr) && pgErr.Code == "40P01":
			deadlocks.Add(1)
			t.Errorf("%s: deadlock: %v", kind, err)
		case delivery.Transient(err):
			failures.Add(1) // a lock timeout behind a replay page: the next one goes on
		default:
			t.Errorf("%s: %v", kind, err)
		}
		n, _ := counts.LoadOrStore(kind, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
	}
	var wg sync.WaitGroup
	loop := func(kind string, every time.Duration, fn func(i int) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				note(kind, fn(i))
				if every > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(every):
					}
				}
			}
		}()
	}
	var products sync.Map
	var written atomic.Int64
	for w := range 2 {
		// Each write runs on the rig's context to its end: a write
		// cancelled mid-commit may still commit after it returned, behind
		// the settling below. The loop stops between writes.
		loop("write", 0, func(i int) error {
			title := fmt.Sprintf("w%d-%d", w, i)
			if i%50 == 7 {
				title = "refused-" + title
			}
			if i%3 == 2 {
				var id string
				products.Range(func(k, _ any) bool { id = k.(string); return rand.IntN(4) != 0 })
				if id != "" {
					return r.w.Update(r.ctx, "product", id, map[string]any{"stock": int64(i)})
				}
			}
			id, err := r.w.Create(r.ctx, "product", map[string]any{"title": title, "stock": int64(i)})
			if err == nil && !strings.HasPrefix(title, "refused-") {
				products.Store(id, true)
				written.Add(1)
			}
			return err
		})
	}
	for d := range 4 {
		svc := instances[d%2]
		ws, err := svc.Workspace("w1")
		require.NoError(t, err)
		loop("wake-up", time.Millisecond, func(int) error {
			_, err := svc.Wake(ctx, ws)
			if errors.Is(err, delivery.ErrDrainRetrying) {
				return nil // deferred: the drainer carries the commit anyway
			}
			return err
		})
	}
	loop("verify", 50*time.Millisecond, func(int) error { _, err := r.svc.Verify(ctx, "w1"); return err })
	loop("replay", 300*time.Millisecond, func(i int) error {
		if i%2 == 0 {
			_, err := instances[1].Replay(ctx, "w1", delivery.PagesOptions{Restart: true})
			return err
		}
		_, err := instances[1].ReplayPartial(ctx, "w1", delivery.PagesOptions{}, delivery.ReplaySelection{Entities: []string{"product"}})
		return err
	})
	loop("vacuum", 200*time.Millisecond, func(int) error {
		_, err := r.pool.Exec(ctx, `VACUUM _ontology_replication_delivery`)
		return err
	})
	wg.Wait()
	r.settle(t, instances...)
	for _, kind := range []string{"write", "wake-up", "verify", "replay", "vacuum"} {
		n, ok := counts.Load(kind)
		require.True(t, ok, "no %s ran", kind)
		t.Logf("%s: %d", kind, n.(*atomic.Int64).Load())
	}
	t.Logf("transient failures (retried by the next call): %d", failures.Load())
	// The wake-up path carried the load: its drainers published at least
	// half as many events as the SDK created (the verifier's sweep and the
	// replays' drains take their share; the replays send events back, so
	// often more), and no drainer gave up waiting for its turn.
	byWakeUps, turnWaits := drainersPublished(t, &logs)
	t.Logf("published by the drainers: %d, created: %d, turn waits past the bound: %d", byWakeUps, written.Load(), turnWaits)
	require.GreaterOrEqual(t, 2*byWakeUps, written.Load(), "the drainers published at least half of what the SDK created")
	require.Zero(t, turnWaits, "no drainer gave up waiting for its turn")

	// The load stopped: Pub/Sub takes everything now, the set-aside events
	// are retried, and everything is delivered and verified.
	ref.on.Store(false)
	aside, err := r.svc.SetAsideEvents(r.ctx, "w1", 1000, true)
	require.NoError(t, err)
	t.Logf("set aside when the load stopped: %d", aside.SetAside.Count)
	_, err = r.svc.DrainAll(r.ctx, "w1", delivery.DrainAllOptions{})
	require.NoError(t, err)
	for r.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NULL`) > 0 {
		res, err := r.svc.Verify(r.ctx, "w1")
		require.NoError(t, err)
		require.Positive(t, res.Verified, "every event left was published: the verifier finds it")
	}

	require.Zero(t, deadlocks.Load(), "deadlocks")
	require.Zero(t, l.overlaps.Load(), "events in two publishes at once (claimed twice)")
	require.Zero(t, r.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL`), "pending")
	var unpublished []string
	rows, err := r.pool.Query(r.ctx, `SELECT encode(sha256(convert_to(t.source_id || ':' || d.event_id || ':' || d.generation, 'UTF8')), 'hex')
		FROM _ontology_replication_delivery d JOIN _ontology_replication_targets t USING (generation) WHERE d.accepted_at IS NOT NULL`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		if _, ok := l.published.Load(id); !ok {
			unpublished = append(unpublished, id)
		}
	}
	require.NoError(t, rows.Err())
	require.Empty(t, unpublished, "accepted but never published")
	require.Zero(t, r.count(t, `SELECT count(*) FROM _ontology_replication_targets t WHERE verified_count <>
		(SELECT count(*) FROM _ontology_replication_delivery d WHERE d.generation = t.generation AND d.verified_at IS NOT NULL)`), "verified_count true")
	require.Zero(t, r.count(t, `SELECT count(*) FROM _ontology_replication_delivery d
		WHERE (d.accepted_at IS NOT NULL) <> EXISTS (SELECT FROM _ontology_replication_receipts r WHERE r.generation = d.generation AND r.event_id = d.event_id)`),
		"a receipt exactly where the event is accepted")
}
