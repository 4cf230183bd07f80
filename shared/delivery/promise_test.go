package delivery_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/await"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// A wake-up answered 2xx is a promise (SPEC §3): its commit is published by
// a drain in flight, never left to a later wake-up or the verifier's sweep.
// The tests here end every wake-up and only then look at the queue: no
// commit whose wake-up has answered may still be pending.

// wakeUps collects the answers of wake-ups started in the background.
type wakeUps struct {
	wg   sync.WaitGroup
	mu   sync.Mutex
	all  []drained
	errs int
}

// start wakes svc's drain of w1 in the background.
func (w *wakeUps) start(ctx context.Context, svc *delivery.Service) {
	w.wg.Go(func() {
		res, err := svc.Drain(ctx, "w1")
		w.mu.Lock()
		defer w.mu.Unlock()
		w.all = append(w.all, drained{res, err})
		if err != nil {
			w.errs++
		}
	})
}

// wait waits, at most two minutes, for every wake-up to answer.
func (w *wakeUps) wait(t testing.TB) []drained {
	t.Helper()
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("a wake-up did not answer within two minutes")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.all
}

// answered2xx counts the wake-ups that would have been answered 2xx, and
// the coalesced ones among them.
func answered2xx(all []drained) (ok, coalesced int) {
	for _, d := range all {
		if d.err == nil {
			ok++
			if d.res.Coalesced {
				coalesced++
			}
		}
	}
	return ok, coalesced
}

// pendingCount is how many delivery rows are pending.
func (r *rig) pendingCount(t testing.TB) int64 {
	t.Helper()
	return r.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL`)
}

// busy makes every wake-up take turns, as on a busy workspace.
func busy(change func(*delivery.Config)) rigOption {
	return withService(func(c *delivery.Config) {
		c.QuietInterval = -1
		if change != nil {
			change(c)
		}
	})
}

// TestASlowBatchStrandsNoCoalescedCommit: while instance A's batch is out
// for 3 s (longer than DrainFor), 250 one-event commits are each woken on
// instance B. The drains queued behind A's wait 3 s before their first
// claim; they go on until nothing is pending (DrainFor counts from a
// drain's first claim, and a drain with more pending goes on, or hands
// over to the drain queued after it): once every wake-up has answered,
// none of the 250 is pending.
func TestASlowBatchStrandsNoCoalescedCommit(t *testing.T) {
	t.Parallel()
	g := newGate()
	r := newRig(t, 2, withPublishReactor(g), busy(nil))
	a, b := r.svc, r.newService()
	for _, svc := range []*delivery.Service{a, b} { // each learns the capture tables
		_, err := svc.Drain(r.ctx, "w1")
		require.NoError(t, err)
	}
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "held"})
	require.NoError(t, err)
	first := r.drainHeld(g)
	released := time.AfterFunc(3*time.Second, g.release) // the fault: a batch out for 3 s
	defer released.Stop()
	var w wakeUps
	for i := range 250 {
		_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "behind it", "stock": int64(i)})
		require.NoError(t, err)
		w.start(r.ctx, b)
	}
	all := w.wait(t)
	require.NoError(t, await.Receive(t, first, "first").err)
	ok, coalesced := answered2xx(all)
	t.Logf("%d wake-ups answered 2xx, %d of them coalesced", ok, coalesced)
	require.Equal(t, 250, ok)
	require.Zero(t, r.pendingCount(t), "every wake-up has answered: none of their commits may be pending")
	r.requireEachAcknowledgedOnce(t, a)
}

// slowWindow holds every Publish request for delay while on.
type slowWindow struct {
	on    atomic.Bool
	delay time.Duration
	held  atomic.Int64
}

// React implements pstest.Reactor.
func (s *slowWindow) React(any) (bool, any, error) {
	if s.on.Load() {
		s.held.Add(1)
		time.Sleep(s.delay) // the fault itself: a slow Pub/Sub
	}
	return false, nil, nil
}

// TestASlowPubSubUnderLoadStrandsNoCommit: the SDK commits every 5 ms for
// 4 s, each commit woken on one of two instances in turn, while every
// Publish takes 3 s for the first 5 s. Once every wake-up has answered,
// nothing is pending.
func TestASlowPubSubUnderLoadStrandsNoCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("a 10 s load")
	}
	t.Parallel()
	slow := &slowWindow{delay: 3 * time.Second}
	r := newRig(t, 2, withPublishReactor(slow), busy(nil))
	instances := []*delivery.Service{r.svc, r.newService()}
	for _, svc := range instances {
		_, err := svc.Drain(r.ctx, "w1")
		require.NoError(t, err)
	}
	slow.on.Store(true)
	off := time.AfterFunc(5*time.Second, func() { slow.on.Store(false) })
	defer off.Stop()
	var w wakeUps
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	commits := 0
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); commits++ {
		<-tick.C
		_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "under load", "stock": int64(commits)})
		require.NoError(t, err)
		w.start(r.ctx, instances[commits%2])
	}
	all := w.wait(t)
	ok, coalesced := answered2xx(all)
	t.Logf("%d commits, %d wake-ups answered 2xx (%d coalesced), %d publishes held", commits, ok, coalesced, slow.held.Load())
	require.Positive(t, slow.held.Load(), "the fault met the drains")
	require.Zero(t, r.pendingCount(t), "every wake-up has answered: none of their commits may be pending")
}

// TestACoalescedWakeUpOutlivesItsDrainsFault: the pending drain a wake-up
// was coalesced into meets a transient fault before its claim: its claim's
// wait for the turn past TurnWait (a slow batch ahead holds the turn), its
// session ended during its gathering, or the SDK's lifecycle lock held by
// a migration past the lock timeout. It queues again and publishes both
// commits: once both wake-ups have answered, nothing is pending.
func TestACoalescedWakeUpOutlivesItsDrainsFault(t *testing.T) {
	t.Parallel()
	for _, fault := range []string{"turn held past TurnWait", "session ended while gathering", "migration holds the lifecycle lock"} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			g := newGate()
			r := newRig(t, 2, withPublishReactor(g), withStore(store.Config{LockTimeout: 300 * time.Millisecond}), busy(func(c *delivery.Config) {
				c.TurnWait = time.Second
				c.Gather = time.Second // the wake-ups reach the pending drain during its gathering
			}))
			a, b := r.svc, r.newService()
			for _, svc := range []*delivery.Service{a, b} {
				_, err := svc.Drain(r.ctx, "w1")
				require.NoError(t, err)
			}
			var first <-chan drained
			var migration chan struct{}
			switch fault {
			case "turn held past TurnWait":
				_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "held"})
				require.NoError(t, err)
				first = r.drainHeld(g)
				released := time.AfterFunc(2500*time.Millisecond, g.release) // longer than TurnWait
				defer released.Stop()
			case "migration holds the lifecycle lock":
				migration = r.holdLifecycleLock(t, 1500*time.Millisecond) // longer than the lock timeout
			}
			var w wakeUps
			for i := range 2 {
				_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "coalesced", "stock": int64(i)})
				require.NoError(t, err)
				w.start(r.ctx, b)
			}
			if fault == "session ended while gathering" {
				r.endTurnHolder(t)
			}
			all := w.wait(t)
			if first != nil {
				require.NoError(t, await.Receive(t, first, "first").err)
			}
			if migration != nil {
				<-migration
			}
			ok, coalesced := answered2xx(all)
			t.Logf("%d of 2 wake-ups answered 2xx, %d coalesced: %+v", ok, coalesced, all)
			require.Zero(t, r.pendingCount(t), "every wake-up has answered: none of their commits may be pending")
		})
	}
}

// holdLifecycleLock holds the SDK's lifecycle lock exclusively for d, as a
// migration does (the singleton row, then the lock), and returns a channel
// closed when it let go.
func (r *rig) holdLifecycleLock(t testing.TB, d time.Duration) chan struct{} {
	t.Helper()
	tx, err := r.pool.Begin(r.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(r.ctx, `SELECT FROM _ontology_replication WHERE id FOR UPDATE`)
	require.NoError(t, err)
	_, err = tx.Exec(r.ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, store.LifecycleLock)
	require.NoError(t, err)
	done := make(chan struct{})
	time.AfterFunc(d, func() {
		defer close(done)
		_ = tx.Commit(context.Background())
	})
	return done
}

// endTurnHolder ends, with pg_terminate_backend, the session that holds
// w1's next turn, once one does (a minute at most).
func (r *rig) endTurnHolder(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ended := r.count(t, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND classid::int = hashtext($1) AND objid::bigint = 2 AND objsubid = 2
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())) ended`, store.DrainTurnClass)
		if ended > 0 {
			t.Logf("ended %d sessions holding the next turn", ended)
			return
		}
		require.True(t, time.Now().Before(deadline), "no session held the next turn")
		time.Sleep(5 * time.Millisecond) // polling the server's lock table: the signal itself
	}
}

// TestADrainsTimeCountsFromItsFirstClaim: a drain that waited longer than
// DrainFor for its turn (a batch ahead out for 11 s) still goes on for
// DrainFor after its first claim: with another instance's drain queued
// behind it, it claims again after that one's batch (or finds nothing
// left) instead of handing the rest over after its first.
func TestADrainsTimeCountsFromItsFirstClaim(t *testing.T) {
	t.Parallel()
	g := newGate()
	// A DrainFor long enough for the drains' alternation on a busy
	// machine, and a batch ahead out longer than it.
	const drainFor, heldFor = 10 * time.Second, 11 * time.Second
	r := newRig(t, 2, withPublishReactor(g), busy(func(c *delivery.Config) { c.DrainFor = drainFor }))
	a, b, c := r.svc, r.newService(), r.newService()
	for _, svc := range []*delivery.Service{a, b, c} {
		_, err := svc.Drain(r.ctx, "w1")
		require.NoError(t, err)
	}
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "held"})
	require.NoError(t, err)
	first := r.drainHeld(g)
	defer g.release()
	require.NoError(t, sdkfixture.BulkCreate(r.ctx, r.pool, sdkfixture.Demo, "product", "title", 250, 250))
	waitedLong := r.wakeUp(b)
	r.awaitTurnWaits(t, 1) // its claim waits for the turn
	queued := r.wakeUp(c)
	r.awaitTurnWaits(t, 2) // it waits for the next turn
	time.Sleep(heldFor)    // the fault: the batch ahead is out longer than DrainFor
	g.release()
	require.NoError(t, await.Receive(t, first, "first").err)
	d, q := await.Receive(t, waitedLong, "the drain that waited"), await.Receive(t, queued, "the queued drain")
	require.NoError(t, d.err)
	require.NoError(t, q.err)
	t.Logf("the drain that waited: %+v; the one queued behind it: %+v", d.res, q.res)
	// Whether it gets a second batch depends on which of the two queues
	// first after their batches; but it never hands the rest over while
	// its DrainFor, counted from its first claim, lasts.
	require.False(t, d.res.HandedOver, "its DrainFor counts from its first claim, not from its arrival")
	require.Positive(t, d.res.Published)
	require.Zero(t, r.pendingCount(t))
}

// flakyPublish fails each Publish request with UNAVAILABLE at random, at
// the given rate (per mille), from a seeded source.
type flakyPublish struct {
	mu       sync.Mutex
	next     uint64
	perMille uint64
	failed   atomic.Int64
}

// React implements pstest.Reactor.
func (f *flakyPublish) React(req any) (bool, any, error) {
	if _, ok := req.(*pubsubpb.PublishRequest); !ok {
		return false, nil, nil
	}
	f.mu.Lock()
	f.next = f.next*6364136223846793005 + 1442695040888963407 // a seeded LCG: the same failures every run
	fail := (f.next>>33)%1000 < f.perMille
	f.mu.Unlock()
	if fail {
		f.failed.Add(1)
		return true, nil, status.Error(codes.Unavailable, "injected: the service is currently unavailable")
	}
	return false, nil, nil
}

// TestAnUnavailablePubSubSetsNoHealthyEventAside: on a quiet workspace
// (every claim one event, published alone), Pub/Sub answers UNAVAILABLE to
// half of the requests. UNAVAILABLE is never an event's own fault: no
// event is set aside, and every one is published.
func TestAnUnavailablePubSubSetsNoHealthyEventAside(t *testing.T) {
	t.Parallel()
	for seed := range uint64(3) {
		flaky := &flakyPublish{next: seed + 1, perMille: 500}
		r := newRig(t, 2, withPublishReactor(flaky))
		for i := range 86 {
			_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "quiet", "stock": int64(i)})
			require.NoError(t, err)
			_, _ = r.svc.Drain(r.ctx, "w1") // a failure is the SDK's deferred; the next wake-up takes it
		}
		flaky.perMille = 0
		r.requireEachAcknowledgedOnce(t, r.svc)
		st, err := r.svc.Status(r.ctx, "w1", "", 10)
		require.NoError(t, err)
		require.Positive(t, flaky.failed.Load())
		require.Zero(t, st.SetAside.Count, "seed %d: %d requests failed UNAVAILABLE; set aside: %+v", seed, flaky.failed.Load(), st.SetAside.Events)
	}
}

// TestAProtocol3DrainPublishesAlone: at protocol 3 the SDK's scan locks
// nothing, so a drain holds its workspace's turn from its scan to its
// acknowledgement: while one drain's batch is out, another instance's
// drain (a quiet one, or one that takes turns) waits, and then finds the
// events acknowledged. No event is published twice.
func TestAProtocol3DrainPublishesAlone(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"quiet", "busy"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			g := newGate()
			opts := []rigOption{withPublishReactor(g), withTemplate(&sdkfixture.V3Template)}
			if mode == "busy" {
				opts = append(opts, busy(nil))
			}
			r := newRig(t, 2, opts...)
			b := r.newService()
			for i := range 5 {
				_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "v3", "stock": int64(i)})
				require.NoError(t, err)
			}
			first := r.drainHeld(g) // its batch of 5 is out
			defer g.release()
			second := r.wakeUp(b)
			r.awaitTurnWaits(t, 1) // the other drain waits for the turn
			g.release()
			f, s := await.Receive(t, first, "first"), await.Receive(t, second, "second")
			require.NoError(t, f.err)
			require.NoError(t, s.err)
			require.Equal(t, 5, f.res.Published)
			require.Zero(t, s.res.Published, "the events were acknowledged when its turn came")
			require.Len(t, r.srv.Messages(), 5, "no event published twice")
		})
	}
}

// TestStatusShowsAHeldTurn: a session that holds the workspace's next turn
// (a drain frozen during its gathering) while another drain waits for it
// shows in the status once held TurnHeldAfter, with the drains waiting.
func TestStatusShowsAHeldTurn(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2, busy(func(c *delivery.Config) { c.TurnWait = time.Minute }))
	conn, err := r.pool.Acquire(r.ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(r.ctx, `SELECT pg_advisory_lock(hashtext($1), 2), set_config('application_name', 'frozen-drain', false)`, store.DrainTurnClass)
	require.NoError(t, err)
	_, err = r.w.Create(r.ctx, "product", map[string]any{"title": "behind the frozen drain"})
	require.NoError(t, err)
	waiting := r.wakeUp(r.svc)
	r.awaitTurnWaits(t, 1)
	deadline := time.Now().Add(time.Minute)
	var st delivery.WorkspaceStatus
	for {
		st, err = r.svc.Status(r.ctx, "w1", "", 10)
		require.NoError(t, err)
		if len(st.TurnsHeld) > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "no held turn reported")
		time.Sleep(100 * time.Millisecond) // until the wait passes TurnHeldAfter
	}
	h := st.TurnsHeld[0]
	require.Equal(t, "next", h.Role)
	require.Equal(t, "frozen-drain", h.Application)
	require.Equal(t, 1, h.Waiting)
	require.GreaterOrEqual(t, h.HeldSeconds, delivery.TurnHeldAfter.Seconds())
	_, err = conn.Exec(r.ctx, `SELECT pg_advisory_unlock_all()`)
	require.NoError(t, err)
	d := await.Receive(t, waiting, "waiting")
	require.NoError(t, d.err)
	require.Equal(t, 1, d.res.Published)
}
