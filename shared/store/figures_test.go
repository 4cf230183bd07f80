package store_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// referenceFigures computes the figures by full scans of the delivery
// table, independently of the store's bounded reads: the oracle they are
// checked against.
func referenceFigures(t *testing.T, e *env, tg store.Target) store.Figures {
	t.Helper()
	var f store.Figures
	var oldestPending, oldestUnverified, setAsideSince *time.Time
	// A set-aside row: pending, with next_verify_at − last_checked_at one
	// of the default backoffs (1, 2, 4, … 32 minutes, 1 hour).
	aside := `(accepted_at IS NULL AND last_checked_at IS NOT NULL AND next_verify_at - last_checked_at IN
		(interval '1 minute', interval '2 minutes', interval '4 minutes', interval '8 minutes', interval '16 minutes', interval '32 minutes', interval '1 hour'))`
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT
		count(*) FILTER (WHERE accepted_at IS NULL AND NOT `+aside+`),
		count(*) FILTER (WHERE `+aside+`),
		min(next_verify_at) FILTER (WHERE accepted_at IS NULL AND NOT `+aside+`),
		count(*) FILTER (WHERE accepted_at IS NOT NULL AND verified_at IS NULL),
		count(*) FILTER (WHERE accepted_at IS NOT NULL AND verified_at IS NULL AND next_verify_at <= now()),
		min(accepted_at) FILTER (WHERE accepted_at IS NOT NULL AND verified_at IS NULL),
		min(last_checked_at - (SELECT coalesce(sum(b), interval '0') FROM unnest(ARRAY[interval '1 minute', interval '2 minutes',
		    interval '4 minutes', interval '8 minutes', interval '16 minutes', interval '32 minutes']) b
		  WHERE b < next_verify_at - last_checked_at)) FILTER (WHERE `+aside+`)
		FROM _ontology_replication_delivery WHERE generation = $1::uuid`, tg.Generation).
		Scan(&f.Pending, &f.SetAside, &oldestPending, &f.Unverified, &f.DueVerifications, &oldestUnverified, &setAsideSince))
	if setAsideSince != nil {
		f.SetAsideSince = *setAsideSince
	}
	if oldestPending != nil {
		f.OldestPending = *oldestPending
	}
	if oldestUnverified != nil {
		f.OldestUnverified = *oldestUnverified
	}
	return f
}

func requireFigures(t *testing.T, e *env, tg store.Target, want store.Figures) {
	t.Helper()
	got, err := e.store.Figures(e.ctx, tg)
	require.NoError(t, err)
	require.True(t, got.OldestPending.Equal(want.OldestPending), "oldest pending %v, want %v", got.OldestPending, want.OldestPending)
	require.True(t, got.OldestUnverified.Equal(want.OldestUnverified), "oldest unverified %v, want %v", got.OldestUnverified, want.OldestUnverified)
	require.True(t, got.SetAsideSince.Equal(want.SetAsideSince), "set aside since %v, want %v", got.SetAsideSince, want.SetAsideSince)
	got.OldestPending, got.OldestUnverified, want.OldestPending, want.OldestUnverified = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	got.SetAsideSince, want.SetAsideSince = time.Time{}, time.Time{}
	require.Equal(t, want, got)
	require.Equal(t, referenceFigures(t, e, tg), func() store.Figures {
		f, _ := e.store.Figures(e.ctx, tg)
		return f
	}(), "the bounded reads agree with full scans")
}

// TestFigures: the figures of real states — fresh, a pending backlog,
// accepted and unverified, partly verified, set aside, replaying — with
// oldest times that differ from the newest, so that min and max cannot be
// confused.
func TestFigures(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	requireFigures(t, e, tg, store.Figures{})

	// A backlog of 20, queued at distinct times an hour apart.
	e.productsBulk(t, 20)
	e.exec(t, `UPDATE _ontology_replication_delivery d SET next_verify_at = now() - (r.n || ' hours')::interval
		FROM (SELECT event_id, row_number() OVER (ORDER BY revision, event_id) AS n FROM _ontology_replication_delivery) r
		WHERE d.event_id = r.event_id`)
	var oldest time.Time
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT min(next_verify_at) FROM _ontology_replication_delivery`).Scan(&oldest))
	requireFigures(t, e, tg, store.Figures{Pending: 20, OldestPending: oldest})

	// Twelve drained: accepted, not verified; the oldest acceptance is the
	// first batch's.
	c, err := e.store.Claim(e.ctx, tg)
	require.NoError(t, err)
	require.Len(t, c.Events, 20)
	_, err = c.Finish(e.ctx, c.IDs()[:12], nil)
	require.NoError(t, err)
	e.exec(t, `UPDATE _ontology_replication_delivery d SET accepted_at = now() - (r.n || ' minutes')::interval,
		next_verify_at = now() + interval '1 minute' * (r.n - 6)
		FROM (SELECT event_id, row_number() OVER (ORDER BY event_id) AS n FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL) r
		WHERE d.event_id = r.event_id`)
	var oldestAccepted, oldestLeft time.Time
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT min(accepted_at) FROM _ontology_replication_delivery`).Scan(&oldestAccepted))
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT min(next_verify_at) FROM _ontology_replication_delivery WHERE accepted_at IS NULL`).Scan(&oldestLeft))
	requireFigures(t, e, tg, store.Figures{Pending: 8, OldestPending: oldestLeft, Unverified: 12, DueVerifications: 6, OldestUnverified: oldestAccepted})

	// Five verified, the oldest among them.
	var verify []string
	rows, err := e.pool.Query(e.ctx, `SELECT event_id::text FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL ORDER BY accepted_at LIMIT 5`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		verify = append(verify, id)
	}
	require.NoError(t, rows.Err())
	_, err = e.store.VerifyEvents(e.ctx, tg, verify)
	require.NoError(t, err)
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT min(accepted_at) FROM _ontology_replication_delivery WHERE verified_at IS NULL AND accepted_at IS NOT NULL`).Scan(&oldestAccepted))
	due := e.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NULL AND accepted_at IS NOT NULL AND next_verify_at <= now()`)
	requireFigures(t, e, tg, store.Figures{Pending: 8, OldestPending: oldestLeft, Unverified: 7, DueVerifications: due, OldestUnverified: oldestAccepted})

	// Three of the pending set aside: counted apart, and not the oldest
	// pending any more.
	c, err = e.store.Claim(e.ctx, tg)
	require.NoError(t, err)
	require.Len(t, c.Events, 8)
	var aside []store.SetAside
	for _, ev := range c.Events[:3] {
		aside = append(aside, store.SetAside{HistoryID: ev.HistoryID, Reason: store.ReasonRejected})
	}
	_, err = c.Finish(e.ctx, nil, aside)
	require.NoError(t, err)
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT min(next_verify_at) FROM _ontology_replication_delivery WHERE accepted_at IS NULL AND last_checked_at IS NULL`).Scan(&oldestLeft))
	var firstAside time.Time
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT min(last_checked_at) FROM _ontology_replication_delivery WHERE last_checked_at IS NOT NULL AND accepted_at IS NULL`).Scan(&firstAside))
	requireFigures(t, e, tg, store.Figures{Pending: 5, SetAside: 3, OldestPending: oldestLeft, Unverified: 7, DueVerifications: due, OldestUnverified: oldestAccepted,
		SetAsideSince: firstAside})
	// One of them set aside for the third time a minute ago (its backoff
	// is 4 minutes): it has been set aside since at least 1 + 2 minutes
	// before that.
	e.exec(t, `UPDATE _ontology_replication_delivery SET last_checked_at = now() - interval '1 minute', next_verify_at = now() + interval '3 minutes'
		WHERE event_id = $1::uuid`, aside[0].HistoryID)
	var thirdTime time.Time
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT last_checked_at FROM _ontology_replication_delivery WHERE event_id = $1::uuid`, aside[0].HistoryID).Scan(&thirdTime))
	requireFigures(t, e, tg, store.Figures{Pending: 5, SetAside: 3, OldestPending: oldestLeft, Unverified: 7, DueVerifications: due, OldestUnverified: oldestAccepted,
		SetAsideSince: thirdTime.Add(-3 * time.Minute)})
	got, err := e.store.Figures(e.ctx, tg)
	require.NoError(t, err)
	require.InDelta(t, (4 * time.Minute).Seconds(), got.SetAsideAge(thirdTime.Add(time.Minute)).Seconds(), 0.001)

	// A replay: every unverified and verified event back to pending, queued
	// now; the set-aside ones are fresh again.
	require.NoError(t, e.store.InitReplay(e.ctx, tg))
	tg = e.target(t)
	for {
		page, err := e.store.AdvanceReplay(e.ctx, tg)
		require.NoError(t, err)
		tg = e.target(t)
		if page.Complete {
			break
		}
	}
	f, err := e.store.Figures(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, referenceFigures(t, e, tg), f)
	require.EqualValues(t, 20, f.Pending, "every event pending again")
	require.Zero(t, f.Unverified)
}

// TestFiguresAtProtocol3: nothing is read.
func TestFiguresAtProtocol3(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V3Template)
	tg := e.start(t)
	_, err := e.store.Figures(e.ctx, tg)
	require.ErrorIs(t, err, store.ErrNoFigures)
}

// TestFiguresPlans: at 10⁶ delivery rows (nearly all verified, as history
// accumulates), the figures read only the partial indexes: no sequential
// scan, and no node reads more than the bounds.
func TestFiguresPlans(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a million delivery rows")
	}
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	fillDelivery(t, e, tg, 1_000_000, 500, 500)
	var raw string
	require.NoError(t, e.pool.QueryRow(e.ctx, "EXPLAIN (FORMAT JSON) "+store.SQLFigures, tg.Generation, store.Backoffs(e.store), store.MaxFigureRows, store.MaxFigureCount, store.WaitedBefore(e.store)).Scan(&raw))
	var plan []map[string]any
	require.NoError(t, json.Unmarshal([]byte(raw), &plan))
	var walk func(node map[string]any, depth int)
	var nodes []string
	walk = func(node map[string]any, depth int) {
		kind, _ := node["Node Type"].(string)
		index, _ := node["Index Name"].(string)
		nodes = append(nodes, fmt.Sprintf("%s%s %s", strings.Repeat("  ", depth), kind, index))
		require.NotEqual(t, "Seq Scan", kind, "a sequential scan of %v", node["Relation Name"])
		require.NotEqual(t, "Bitmap Heap Scan", kind, "a bitmap scan of %v", node["Relation Name"])
		if strings.HasPrefix(kind, "Index") {
			require.Contains(t, []string{"_ontology_delivery_pending", "_ontology_delivery_verify"}, index, "reads only the partial indexes")
		}
		children, _ := node["Plans"].([]any)
		for _, c := range children {
			walk(c.(map[string]any), depth+1)
		}
	}
	walk(plan[0]["Plan"].(map[string]any), 0)
	t.Logf("plan:\n%s", strings.Join(nodes, "\n"))
	f, err := e.store.Figures(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, referenceFigures(t, e, tg), f)
}

// fillDelivery gives the target n delivery rows, of which pending are
// pending and unverified accepted and unverified, the rest verified, and
// analyses the table (rows of no history table: the figures read none).
func fillDelivery(t testing.TB, e *env, tg store.Target, n, pending, unverified int) {
	t.Helper()
	_, err := e.pool.Exec(e.ctx, `INSERT INTO _ontology_replication_delivery
		(generation, event_id, history_table, revision, accepted_at, verified_at, next_verify_at)
		SELECT $1::uuid, gen_random_uuid(), 'product_history', 1000000 + i,
		       CASE WHEN i > $3 THEN now() - interval '1 hour' + i * interval '1 ms' END,
		       CASE WHEN i > $3 + $4 THEN now() END,
		       now() - interval '2 hours' + i * interval '1 ms'
		  FROM generate_series(1, $2::int) i`, tg.Generation, n, pending, unverified)
	require.NoError(t, err)
	_, err = e.pool.Exec(e.ctx, `VACUUM ANALYZE _ontology_replication_delivery`)
	require.NoError(t, err)
}

// BenchmarkFigures measures the figures read at 10³ and 10⁶ delivery rows
// with the same outstanding work (250 pending, 250 unverified; the rest
// verified, as history accumulates), in the same run: the ratio is what a
// thousand times more history costs (the goal: at most 1.2).
func BenchmarkFigures(b *testing.B) {
	type size struct {
		e  *env
		tg store.Target
		ns time.Duration
	}
	var sizes []*size
	for _, n := range []int{1_000, 1_000_000} {
		e := newEnv(b, &sdkfixture.V4Template)
		tg := e.start(b)
		fillDelivery(b, e, tg, n, 250, 250)
		sizes = append(sizes, &size{e: e, tg: tg})
	}
	for _, s := range sizes { // warm
		_, err := s.e.store.Figures(s.e.ctx, s.tg)
		require.NoError(b, err)
	}
	for b.Loop() {
		for _, s := range sizes {
			started := time.Now()
			_, err := s.e.store.Figures(s.e.ctx, s.tg)
			s.ns += time.Since(started)
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	small, large := float64(sizes[0].ns)/float64(b.N), float64(sizes[1].ns)/float64(b.N)
	b.ReportMetric(small/1e6, "ms/read@1e3")
	b.ReportMetric(large/1e6, "ms/read@1e6")
	b.ReportMetric(large/small, "ratio")
}

// TestFiguresAtTheRowCap: past MaxFigureRows outstanding rows the times
// and the set-aside split come from the first of them only, and the
// figures say so (Capped); below it they are exact. The counts themselves
// stay exact up to MaxFigureCount.
func TestFiguresAtTheRowCap(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                string
		pending, unverified int
		capped              bool
	}{
		{"below the cap", store.MaxFigureRows - 1, 0, false},
		{"pending rows past it", store.MaxFigureRows + 1, 0, true},
		{"unverified rows past it", 0, store.MaxFigureRows + 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, &sdkfixture.V4Template)
			tg := e.start(t)
			fillDelivery(t, e, tg, tc.pending+tc.unverified, tc.pending, tc.unverified)
			f, err := e.store.Figures(e.ctx, tg)
			require.NoError(t, err)
			require.Equal(t, tc.capped, f.Capped)
			require.EqualValues(t, tc.pending, f.Pending, "the count is exact")
			require.EqualValues(t, tc.unverified, f.Unverified, "the count is exact")
		})
	}
}
