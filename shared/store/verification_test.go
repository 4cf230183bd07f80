package store_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

func TestVerifyAndRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.products(t, 1) // in the baseline
	tg := e.start(t)
	e.products(t, 5)
	e.drainAll(t, tg)

	due, err := e.store.DueUnverified(e.ctx, tg)
	require.NoError(t, err)
	require.Len(t, due, 6)
	for _, r := range due {
		require.Equal(t, sha(tg.SourceID+":"+r.HistoryID+":"+tg.Generation), r.EventID)
	}
	ids := func(refs []store.Ref) []string {
		var out []string
		for _, r := range refs {
			out = append(out, r.HistoryID)
		}
		return out
	}
	// The baseline event goes to the absent, recent group, so the generation
	// cannot be initially ready before the end.
	var baseline string
	require.NoError(t, e.pool.QueryRow(e.ctx, "SELECT id::text FROM _ontology_replication_baselines").Scan(&baseline))
	for i, r := range due {
		if r.HistoryID == baseline {
			due[i], due[2] = due[2], due[i]
		}
	}
	present, absentRecent, absentOld := ids(due[:2]), ids(due[2:4]), ids(due[4:])
	// Both sides of the 15-minute boundary: the old ones accepted just over
	// 15 minutes ago, the recent ones just under.
	e.exec(t, `UPDATE _ontology_replication_delivery SET accepted_at = now() - interval '15 minutes 5 seconds' WHERE event_id = ANY($1::uuid[])`, absentOld)
	e.exec(t, `UPDATE _ontology_replication_delivery SET accepted_at = now() - interval '14 minutes 55 seconds' WHERE event_id = ANY($1::uuid[])`, absentRecent)

	n, err := e.store.VerifyEvents(e.ctx, tg, present)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	n, err = e.store.VerifyEvents(e.ctx, tg, present)
	require.NoError(t, err)
	require.Zero(t, n, "verifying twice counts once")
	require.EqualValues(t, 2, e.count(t, "SELECT verified_count FROM _ontology_replication_targets"))
	require.EqualValues(t, 2, e.count(t, "SELECT count(*) FROM _ontology_replication_receipts WHERE verified_at IS NOT NULL"))

	requeued, err := e.store.RetryUnverified(e.ctx, tg, append(append([]string{}, absentRecent...), absentOld...))
	require.NoError(t, err)
	require.ElementsMatch(t, absentOld, requeued, "the ones accepted over 15 minutes ago went back to pending")
	require.EqualValues(t, 2, e.count(t, `SELECT count(*) FROM _ontology_replication_delivery
		WHERE event_id = ANY($1::uuid[]) AND accepted_at IS NOT NULL AND last_checked_at > now() - interval '5 seconds'
		  AND next_verify_at = last_checked_at + interval '30 seconds'`, absentRecent), "looked at again exactly 30 seconds after the check")
	require.EqualValues(t, 2, e.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE event_id = ANY($1::uuid[]) AND accepted_at IS NULL`, absentOld))
	require.Zero(t, e.count(t, `SELECT count(*) FROM _ontology_replication_receipts WHERE event_id = ANY($1::uuid[])`, absentOld))
	require.EqualValues(t, 2, e.count(t, `SELECT count(*) FROM _ontology_replication_receipts WHERE event_id = ANY($1::uuid[])`, absentRecent))

	due, err = e.store.DueUnverified(e.ctx, tg)
	require.NoError(t, err)
	require.Empty(t, due, "retried events are not due for 30 seconds; requeued ones are pending")

	status, err := e.store.Status(e.ctx, tg)
	require.NoError(t, err)
	require.EqualValues(t, 6, status.Total)
	require.EqualValues(t, 4, status.Accepted)
	require.EqualValues(t, 2, status.Verified)
	require.EqualValues(t, 2, status.Pending)
	require.Zero(t, status.DueVerifications)
	require.False(t, status.InitiallyReady, "the baseline event is not verified")

	again := e.drainAll(t, tg)
	require.ElementsMatch(t, absentOld, again, "the sweep republishes what went back to pending")
	e.exec(t, `UPDATE _ontology_replication_delivery SET next_verify_at = now() WHERE verified_at IS NULL`)
	due, err = e.store.DueUnverified(e.ctx, tg)
	require.NoError(t, err)
	require.Len(t, due, 4)
	_, err = e.store.VerifyEvents(e.ctx, tg, ids(due))
	require.NoError(t, err)
	ready, err := e.store.InitiallyReady(e.ctx, tg)
	require.NoError(t, err)
	require.True(t, ready)
	status, err = e.store.Status(e.ctx, tg)
	require.NoError(t, err)
	require.Equal(t, store.Status{Total: 6, Accepted: 6, Verified: 6, InitiallyReady: true}, status)
}

func TestRetryOnlyTouchesCheckedIDs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 3)
	e.drainAll(t, tg)
	e.exec(t, `UPDATE _ontology_replication_delivery SET accepted_at = now() - interval '1 hour'`)
	due, err := e.store.DueUnverified(e.ctx, tg)
	require.NoError(t, err)
	back, err := e.store.RetryUnverified(e.ctx, tg, []string{due[0].HistoryID})
	require.NoError(t, err)
	require.Equal(t, []string{due[0].HistoryID}, back)
	require.EqualValues(t, 2, e.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL`),
		"an unchecked backlog is never a delivery failure")
	back, err = e.store.RetryUnverified(e.ctx, tg, nil)
	require.NoError(t, err)
	require.Empty(t, back)
}
