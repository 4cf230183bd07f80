package functions

import (
	"bytes"
	"context"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// wakeLoad is one measured run: what the writers did and saw.
type wakeLoad struct {
	commits, failed int
	elapsed         time.Duration
	answers         []time.Duration // each wake-up's answer, as the SDK waited for it
	statuses        map[int]int     // 0: no answer within the SDK's 5 s
	committed       []map[string]time.Time
}

// drive runs 8 SDK writers at rate commits a second over the workspaces
// (uniform, or Zipf-skewed) for d: each commits, then wakes the drain of
// its workspace on a random instance and awaits the answer (5 s at most),
// as the SDK does. With floor, no wake-up: the floor drains instead (see
// floorDrainer), off the writers' path.
func (wb *wakeBench) drive(b *testing.B, rate int, d time.Duration, zipf, floor bool) wakeLoad {
	b.Helper()
	ld := wakeLoad{statuses: map[int]int{}, committed: make([]map[string]time.Time, len(wb.spaces))}
	for i := range ld.committed {
		ld.committed[i] = map[string]time.Time{}
	}
	var mu sync.Mutex
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	pick := func(r *rand.Rand) int { return r.IntN(len(wb.spaces)) }
	if zipf {
		pick = newZipf(len(wb.spaces)).pick
	}
	var fd *floorDrainer
	if floor {
		fd = wb.startFloor(b)
	}
	tokens := make(chan struct{}, 8)
	var writers sync.WaitGroup
	for w := range 8 {
		writers.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 42))
			for range tokens {
				i := pick(r)
				sp := wb.spaces[i]
				id, err := sp.w.Create(wb.ctx, "product", map[string]any{"title": "woken"})
				committed := time.Now()
				mu.Lock()
				if err != nil {
					ld.failed++
					mu.Unlock()
					continue
				}
				ld.commits++
				ld.committed[i][id] = committed
				mu.Unlock()
				if fd != nil {
					fd.mark(i)
					continue
				}
				status, took := wb.wake(client, wb.instances[r.IntN(len(wb.instances))].URL, sp)
				mu.Lock()
				ld.answers = append(ld.answers, took)
				ld.statuses[status]++
				mu.Unlock()
			}
		})
	}
	start := time.Now()
	if rate == 0 {
		time.Sleep(d) // an idle workspace: nothing committed, nothing woken
	}
	interval := time.Second / time.Duration(max(rate, 1))
	for n := 0; rate > 0 && time.Since(start) < d; n++ {
		if wait := time.Until(start.Add(time.Duration(n) * interval)); wait > 0 {
			time.Sleep(wait) // the workload's pace
		}
		tokens <- struct{}{}
	}
	close(tokens)
	writers.Wait()
	ld.elapsed = time.Since(start)
	if fd != nil {
		fd.stop()
	}
	return ld
}

// floorDrainer is the floor the drain is measured against: the least SQL
// that can publish a workspace's commits at about the drain's latency.
// Every gather it drains each workspace committed to since its last
// round, on the workspace's warm connection, with
// sdkfixture.DrainWithFloor (claim and read, then lock and accept; nothing
// published between), four workspaces at a time: one round a gather, as a
// perfectly coalescing drain with no turn, no try-lock and no session of
// its own would.
type floorDrainer struct {
	wb    *wakeBench
	b     *testing.B
	mu    sync.Mutex
	dirty map[int]bool
	done  chan struct{}
	ended chan struct{}
}

func (wb *wakeBench) startFloor(b *testing.B) *floorDrainer {
	fd := &floorDrainer{wb: wb, b: b, dirty: map[int]bool{}, done: make(chan struct{}), ended: make(chan struct{})}
	go func() {
		defer close(fd.ended)
		t := time.NewTicker(wb.gather)
		defer t.Stop()
		for {
			select {
			case <-fd.done:
				fd.round()
				return
			case <-t.C:
				fd.round()
			}
		}
	}()
	return fd
}

// mark records a commit to workspace i.
func (fd *floorDrainer) mark(i int) {
	fd.mu.Lock()
	fd.dirty[i] = true
	fd.mu.Unlock()
}

// round drains the workspaces committed to since the last round.
func (fd *floorDrainer) round() {
	fd.mu.Lock()
	dirty := fd.dirty
	fd.dirty = map[int]bool{}
	fd.mu.Unlock()
	work := make(chan int, len(dirty))
	for i := range dirty {
		work <- i
	}
	close(work)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range work {
				sp := fd.wb.spaces[i]
				if _, err := sdkfixture.DrainWithFloor(fd.wb.ctx, sp.floor, sp.gen, func([]string, [][]byte) error { return nil }); err != nil {
					fd.b.Error(err)
				}
			}
		})
	}
	wg.Wait()
}

// stop drains what is left and stops the floor.
func (fd *floorDrainer) stop() {
	close(fd.done)
	<-fd.ended
}

// wake calls the drain as the SDK does (service/replication.js): POST,
// the runtime token and organisation, 5 s; it returns the status (0: none
// within 5 s) and how long the SDK waited.
func (wb *wakeBench) wake(client *http.Client, base string, sp *benchSpace) (int, time.Duration) {
	ctx, cancel := context.WithTimeout(wb.ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/internal/v1/workspaces/"+sp.id+"/ontology/replication/drain", nil)
	req.Header.Set(headerIdentity, sp.token)
	req.Header.Set(headerOrganization, sp.org)
	started := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, time.Since(started)
	}
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, time.Since(started)
}

// settle waits until no instance runs a drainer.
func (wb *wakeBench) settle(b *testing.B) {
	b.Helper()
	ctx, cancel := context.WithTimeout(wb.ctx, 5*time.Minute)
	defer cancel()
	for _, srv := range wb.servers {
		require.NoError(b, srv.svc.Idle(ctx))
	}
}

// latencies are the commits' times from commit to accepted, read from
// each workspace's delivery rows.
func (wb *wakeBench) latencies(b *testing.B, committed []map[string]time.Time) []time.Duration {
	b.Helper()
	var out []time.Duration
	for i, sp := range wb.spaces {
		if len(committed[i]) == 0 {
			continue
		}
		ids := make([]string, 0, len(committed[i]))
		for id := range committed[i] {
			ids = append(ids, id)
		}
		rows, err := sp.writer.Query(wb.ctx, `SELECT h.record_id::text, d.accepted_at FROM product_history h
			JOIN _ontology_replication_delivery d ON d.event_id = h.id WHERE h.record_id = ANY ($1::uuid[])`, ids)
		require.NoError(b, err)
		var key string
		var accepted *time.Time
		_, err = pgx.ForEachRow(rows, []any{&key, &accepted}, func() error {
			require.NotNil(b, accepted, "workspace %s: record %s never accepted", sp.id, key)
			out = append(out, accepted.Sub(committed[i][key]))
			return nil
		})
		require.NoError(b, err)
	}
	slices.Sort(out)
	return out
}

// serverFigures are the server's counters the bench reads: sessions
// opened in the workspaces' databases, and the drain role's statements.
type serverFigures struct{ sessions, statements int64 }

func (wb *wakeBench) figures(b *testing.B) serverFigures {
	b.Helper()
	var f serverFigures
	require.NoError(b, wb.admin.QueryRow(wb.ctx, `SELECT coalesce(sum(sessions), 0)::bigint FROM pg_stat_database
		WHERE datname NOT IN ('postgres', 'template0', 'template1')`).Scan(&f.sessions))
	require.NoError(b, wb.admin.QueryRow(wb.ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements s JOIN pg_roles u ON u.oid = s.userid
		WHERE u.rolname = 'drainer'`).Scan(&f.statements))
	return f
}

// watchBackends samples, until stop, the most sessions the drain's role
// held at once.
func (wb *wakeBench) watchBackends(b *testing.B) (stop func() int64) {
	b.Helper()
	var peak atomic.Int64
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			var n int64
			if wb.admin.QueryRow(wb.ctx, `SELECT count(*) FROM pg_stat_activity WHERE usename = 'drainer'`).Scan(&n) == nil && n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() int64 { close(done); <-ended; return peak.Load() }
}

// zipf picks workspaces with probability ∝ 1/rank (s = 1).
type zipf struct{ cdf []float64 }

func newZipf(n int) *zipf {
	z := &zipf{cdf: make([]float64, n)}
	sum := 0.0
	for i := range n {
		sum += 1 / float64(i+1)
		z.cdf[i] = sum
	}
	for i := range z.cdf {
		z.cdf[i] /= sum
	}
	return z
}

func (z *zipf) pick(r *rand.Rand) int {
	i, _ := slices.BinarySearch(z.cdf, r.Float64())
	return min(i, len(z.cdf)-1)
}

// percentileOf is the p-th of sorted durations.
func percentileOf(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(math.Floor(float64(len(sorted))*p)))]
}
