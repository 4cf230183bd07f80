package delivery_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// A wake-up answered 2xx is a promise (SPEC §3): its commit is published by
// the drainer of the process that answered, never left to a later wake-up
// or the verifier's sweep. The tests here let every drainer end (settle:
// the product's signal that every answered wake-up has been carried out)
// and only then look at the queue: no commit whose wake-up was answered may
// still be pending.

// answers counts wake-ups' answers.
type answers struct {
	mu                        sync.Mutex
	promised, coalesced, errs int
	deferred                  []error
}

// wake wakes svc's drainer of w1 and counts the answer; it returns whether
// it was a promise.
func (a *answers) wake(t testing.TB, r *rig, svc *delivery.Service) bool {
	ans, err := r.wake(t, svc)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.errs++
		a.deferred = append(a.deferred, err)
		return false
	}
	a.promised++
	if ans.Coalesced {
		a.coalesced++
	}
	return true
}

// pendingCount is how many delivery rows are pending.
func (r *rig) pendingCount(t testing.TB) int64 {
	t.Helper()
	return r.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL`)
}

// pendingEvents is how many events are pending, at either protocol (as
// the status counts them).
func (r *rig) pendingEvents(t testing.TB) int64 {
	t.Helper()
	st, err := r.svc.Status(r.ctx, "w1", "", 10)
	require.NoError(t, err)
	return st.Pending
}

// busy makes every claim take turns, as on a busy workspace.
func busy(change func(*delivery.Config)) rigOption {
	return withService(func(c *delivery.Config) {
		c.QuietInterval = -1
		if change != nil {
			change(c)
		}
	})
}

// TestASlowBatchStrandsNoCommit: while instance A's batch is out for 3 s,
// 250 one-event commits are each woken on instance B, every one answered at
// once with a promise; once both drainers have ended, none of the 250 is
// pending, and each event was acknowledged once.
func TestASlowBatchStrandsNoCommit(t *testing.T) {
	t.Parallel()
	g := newGate()
	r := newRig(t, 2, withGate(g), busy(nil))
	a, b := r.svc, r.newService()
	_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "held"})
	require.NoError(t, err)
	r.drainHeld(t, g)
	released := time.AfterFunc(3*time.Second, g.release) // the fault: a batch out for 3 s
	defer released.Stop()
	var w answers
	for i := range 250 {
		_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "behind it", "stock": int64(i)})
		require.NoError(t, err)
		require.True(t, w.wake(t, r, b), "%v", w.deferred)
	}
	r.settle(t, a, b)
	t.Logf("%d wake-ups promised, %d of them coalesced into a running drainer", w.promised, w.coalesced)
	require.Positive(t, w.coalesced)
	require.Zero(t, r.pendingCount(t), "every wake-up was answered: none of their commits may be pending")
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
// Publish takes 3 s for the first 5 s. Once every drainer has ended,
// nothing is pending.
func TestASlowPubSubUnderLoadStrandsNoCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("a 10 s load")
	}
	t.Parallel()
	slow := &slowWindow{delay: 3 * time.Second}
	r := newRig(t, 2, withPublishReactor(slow), busy(nil))
	instances := []*delivery.Service{r.svc, r.newService()}
	slow.on.Store(true)
	off := time.AfterFunc(5*time.Second, func() { slow.on.Store(false) })
	defer off.Stop()
	var w answers
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	commits := 0
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); commits++ {
		<-tick.C
		_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "under load", "stock": int64(commits)})
		require.NoError(t, err)
		w.wake(t, r, instances[commits%2])
	}
	r.settle(t, instances...)
	t.Logf("%d commits, %d wake-ups promised (%d coalesced), %d deferred, %d publishes held", commits, w.promised, w.coalesced, w.errs, slow.held.Load())
	require.Positive(t, slow.held.Load(), "the fault met the drainers")
	require.Equal(t, commits, w.promised, "a slow Pub/Sub is no fault: every wake-up is a promise")
	require.Zero(t, r.pendingCount(t), "every wake-up was answered: none of their commits may be pending")
}

// lifecycleHold is the SDK's lifecycle lock held exclusively, as a
// migration holds it, until end.
type lifecycleHold struct {
	tx   pgx.Tx
	once sync.Once
}

// holdLifecycleLock holds the SDK's lifecycle lock exclusively (the
// singleton row, then the lock) for d at most, or until end.
func (r *rig) holdLifecycleLock(t testing.TB, d time.Duration) *lifecycleHold {
	t.Helper()
	tx, err := r.pool.Begin(r.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(r.ctx, `SELECT FROM _ontology_replication WHERE id FOR UPDATE`)
	require.NoError(t, err)
	_, err = tx.Exec(r.ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, store.LifecycleLock)
	require.NoError(t, err)
	h := &lifecycleHold{tx: tx}
	timer := time.AfterFunc(d, h.end)
	t.Cleanup(func() { timer.Stop(); h.end() })
	return h
}

func (h *lifecycleHold) end() { h.once.Do(func() { _ = h.tx.Commit(context.Background()) }) }

// TestAPromiseOutlivesItsDrainersFault: the drainer two wake-ups were
// answered on meets a fault before its claim: another session holds the
// next turn past TurnWait, its own session is ended while it gathers, or
// the SDK's lifecycle lock is held by a migration past the lock timeout.
// It backs off and claims again: once it has ended, nothing is pending.
func TestAPromiseOutlivesItsDrainersFault(t *testing.T) {
	t.Parallel()
	for _, fault := range []string{"next turn held past TurnWait", "session ended while gathering", "migration holds the lifecycle lock"} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, 2, withStore(store.Config{LockTimeout: 300 * time.Millisecond}), busy(func(c *delivery.Config) {
				c.TurnWait = time.Second
				c.Gather = time.Second // the second wake-up reaches the drainer during its gathering
			}))
			switch fault {
			case "next turn held past TurnWait":
				holder := r.holdNextTurn(t, "")
				time.AfterFunc(2500*time.Millisecond, func() { _ = holder.Close(context.Background()) })
			case "migration holds the lifecycle lock":
				r.holdLifecycleLock(t, 1500*time.Millisecond) // longer than the lock timeout
			}
			var w answers
			for i := range 2 {
				_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "promised", "stock": int64(i)})
				require.NoError(t, err)
				w.wake(t, r, r.svc)
			}
			if fault == "session ended while gathering" {
				r.endTurnHolder(t)
			}
			r.settle(t)
			t.Logf("%d of 2 wake-ups promised: %v", w.promised, w.deferred)
			require.Positive(t, w.promised)
			require.Zero(t, r.pendingCount(t), "the drainer ended: none of its commits may be pending")
		})
	}
}

// holdNextTurn takes w1's next turn on a session of its own, as a drainer
// that then froze (application name app), and returns the session.
func (r *rig) holdNextTurn(t testing.TB, app string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(r.ctx, r.url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(r.ctx, `SELECT pg_advisory_lock(hashtext($1), 2), set_config('application_name', $2, false)`, store.DrainTurnClass, app)
	require.NoError(t, err)
	return conn
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

// TestAFrozenTurnHolderIsEndedAndTheDrainerClaims: a drainer of another
// instance froze while it held the next turn (its session idle, with the
// turn's idle timeout set); the drainer woken behind it waits in the
// server, the server ends the frozen session after its idle timeout, and
// the drainer takes the turn and publishes its commit.
func TestAFrozenTurnHolderIsEndedAndTheDrainerClaims(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2, busy(nil))
	frozen := r.holdNextTurn(t, "frozen-drain")
	_, err := frozen.Exec(r.ctx, `SELECT set_config('idle_session_timeout', '1000', false)`)
	require.NoError(t, err)
	_, err = r.w.Create(r.ctx, "product", map[string]any{"title": "behind the frozen drain"})
	require.NoError(t, err)
	r.wakeOK(t, r.svc)
	r.settle(t)
	require.Zero(t, r.pendingCount(t))
	require.True(t, frozen.IsClosed() || frozen.Ping(r.ctx) != nil, "the server ended the frozen holder")
}

// TestABatchSlowerThanTheIdleBoundIsAcknowledged: a batch out three times
// as long as the store's idle timeout, at protocol 4 and 3 (whose claim
// holds the turn while its batch is out), is acknowledged: the drainer
// keeps its session alive while the publish is out, so the server does
// not end it, and nothing is published twice.
func TestABatchSlowerThanTheIdleBoundIsAcknowledged(t *testing.T) {
	t.Parallel()
	for _, protocol := range []string{"4", "3"} {
		t.Run("protocol "+protocol, func(t *testing.T) {
			t.Parallel()
			g := newGate()
			opts := []rigOption{withGate(g), withStore(store.Config{IdleTimeout: time.Second})}
			if protocol == "3" {
				opts = append(opts, withTemplate(&sdkfixture.V3Template))
			}
			r := newRig(t, 2, opts...)
			for i := range 5 {
				_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "slow", "stock": int64(i)})
				require.NoError(t, err)
			}
			r.drainHeld(t, g)
			released := time.AfterFunc(3*time.Second, g.release)
			defer released.Stop()
			r.settle(t)
			require.Zero(t, r.pendingEvents(t))
			require.Len(t, r.srv.Messages(), 5, "no batch published twice: the session outlived its publish")
		})
	}
}

// outage fails every Publish request with UNAVAILABLE while on.
type outage struct {
	on     atomic.Bool
	failed atomic.Int64
}

// React implements pstest.Reactor.
func (o *outage) React(req any) (bool, any, error) {
	if _, ok := req.(*pubsubpb.PublishRequest); ok && o.on.Load() {
		o.failed.Add(1)
		return true, nil, status.Error(codes.Unavailable, "injected: the service is currently unavailable")
	}
	return false, nil, nil
}

// TestAnOutageKeepsThePromisesMadeBeforeIt: Pub/Sub is unavailable for
// 2 s while the SDK commits on. The wake-ups answered before the drainer
// met the outage are promises; those during its backoff are deferred
// (503); when Pub/Sub is back the drainer, which never gave up, publishes
// every commit, the deferred ones too, with no other wake-up.
func TestAnOutageKeepsThePromisesMadeBeforeIt(t *testing.T) {
	t.Parallel()
	down := &outage{}
	r := newRig(t, 2, withPublishReactor(down))
	down.on.Store(true)
	back := time.AfterFunc(2*time.Second, func() { down.on.Store(false) })
	defer back.Stop()
	var w answers
	for i := 0; i < 200 && down.on.Load(); i++ {
		_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "during the outage", "stock": int64(i)})
		require.NoError(t, err)
		w.wake(t, r, r.svc)
		time.Sleep(10 * time.Millisecond) // the SDK's pace
	}
	r.settle(t)
	t.Logf("%d promised, %d deferred, %d requests failed", w.promised, w.errs, down.failed.Load())
	require.Positive(t, w.errs, "wake-ups during the drainer's backoff are deferred")
	for _, err := range w.deferred {
		require.ErrorIs(t, err, delivery.ErrDrainRetrying)
		require.True(t, delivery.Transient(err))
	}
	require.Zero(t, r.pendingCount(t), "every commit published once Pub/Sub was back")
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
		for i := range 20 {
			_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "quiet", "stock": int64(i)})
			require.NoError(t, err)
			_, _ = r.wake(t, r.svc) // a deferral is the SDK's to log; the drainer carries the commit anyway
			r.settle(t)             // one event a claim
		}
		r.requireEachAcknowledgedOnce(t, r.svc)
		st, err := r.svc.Status(r.ctx, "w1", "", 10)
		require.NoError(t, err)
		require.Positive(t, flaky.failed.Load())
		require.Zero(t, st.SetAside.Count, "seed %d: %d requests failed UNAVAILABLE; set aside: %+v", seed, flaky.failed.Load(), st.SetAside.Events)
	}
}

// TestAProtocol3DrainPublishesAlone: at protocol 3 the SDK's scan locks
// nothing, so a claim holds the workspace's turn from its scan to its
// acknowledgement: while one drainer's batch is out, another instance's
// drainer waits for the turn, and then finds the events acknowledged. No
// event is published twice.
func TestAProtocol3DrainPublishesAlone(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"quiet", "busy"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			g := newGate()
			opts := []rigOption{withGate(g), withTemplate(&sdkfixture.V3Template)}
			if mode == "busy" {
				opts = append(opts, busy(nil))
			}
			r := newRig(t, 2, opts...)
			b := r.newService()
			for i := range 5 {
				_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "v3", "stock": int64(i)})
				require.NoError(t, err)
			}
			r.drainHeld(t, g) // its batch of 5 is out
			defer g.release()
			r.wakeOK(t, b)
			r.awaitTurnWaits(t, 1) // the other drainer's claim waits for the turn
			g.release()
			r.settle(t, r.svc, b)
			require.Zero(t, r.pendingEvents(t))
			require.Len(t, r.srv.Messages(), 5, "no event published twice")
		})
	}
}

// awaitTurnWaits waits until n sessions of the rig's database wait in the
// server for a lock of the drain's turns (the server's lock table is the
// signal).
func (r *rig) awaitTurnWaits(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for r.count(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid::int = hashtext($1)
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, store.DrainTurnClass) < n {
		require.True(t, time.Now().Before(deadline), "%d drainers do not wait for a turn", n)
		time.Sleep(5 * time.Millisecond)
	}
}

// hang holds every Publish in the server while on, as a Pub/Sub that
// stops answering: the client's time-out ends each RPC.
type hang struct {
	on      atomic.Bool
	release chan struct{}
	held    atomic.Int64
}

// React implements pstest.Reactor.
func (h *hang) React(req any) (bool, any, error) {
	if _, ok := req.(*pubsubpb.PublishRequest); ok && h.on.Load() {
		h.held.Add(1)
		<-h.release
		return true, nil, status.Error(codes.Unavailable, "injected: the hang ended")
	}
	return false, nil, nil
}

// failingAfter records when the latest Publish that began after a mark
// failed.
type failingAfter struct {
	delivery.Publisher
	mark   atomic.Int64 // unix nanoseconds
	failed atomic.Bool  // one that began after mark failed
}

func (p *failingAfter) Publish(ctx context.Context, topic string, data [][]byte) ([]string, error) {
	began := time.Now().UnixNano()
	ids, err := p.Publisher.Publish(ctx, topic, data)
	if err != nil && began > p.mark.Load() {
		p.failed.Store(true)
	}
	return ids, err
}

// TestAPubSubHangKeepsThePromises: Pub/Sub stops answering for ten of the
// publisher's time-outs while the SDK commits on (the 40 s hang of a
// 10 s time-out, scaled down), and stays hung until a publish begun after
// the last wake-up has failed too. Every wake-up is answered at once;
// those answered 2xx are promises, and when Pub/Sub answers again the
// drainer, which never gave up, publishes every commit with no other
// wake-up.
func TestAPubSubHangKeepsThePromises(t *testing.T) {
	t.Parallel()
	h := &hang{release: make(chan struct{})}
	watch := &failingAfter{}
	r := newRig(t, 2, withPublishReactor(h), withPublishTimeout(300*time.Millisecond),
		withPublisher(func(p delivery.Publisher) delivery.Publisher { watch.Publisher = p; return watch }))
	h.on.Store(true)
	end := time.Now().Add(3 * time.Second)
	var w answers
	for time.Now().Before(end) {
		_, err := r.w.Create(r.ctx, "product", map[string]any{"title": "during the hang"})
		require.NoError(t, err)
		w.wake(t, r, r.svc)
		time.Sleep(20 * time.Millisecond) // the SDK's pace
	}
	watch.mark.Store(time.Now().UnixNano())
	require.Eventually(t, watch.failed.Load, time.Minute, 10*time.Millisecond, "a claim after the last wake-up met the hang")
	h.on.Store(false)
	close(h.release)
	r.settle(t)
	t.Logf("%d promised, %d deferred", w.promised, w.errs)
	require.Positive(t, w.promised)
	require.Zero(t, r.pendingCount(t), "every commit acknowledged once Pub/Sub answered again")
	require.Len(t, r.publishedTimes(t), int(r.count(t, "SELECT count(*) FROM _ontology_replication_delivery")),
		"and every one published: nothing acknowledged that Pub/Sub did not take")
}
