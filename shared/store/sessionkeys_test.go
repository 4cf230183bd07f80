package store_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestASessionLetsGoWhatItsClaimDoesNotCarry: an event past the SDK's byte
// bound comes in a claim of its own; the rows its claim read and locked
// behind it are let go by the session's next round trip, whose claim,
// made while the first is out, starts right after the event and takes
// them.
func TestASessionLetsGoWhatItsClaimDoesNotCarry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	e.products(t, 1)
	e.exec(t, `UPDATE product_history SET replication = jsonb_set(replication, '{payload}', to_jsonb(repeat('x', 2 << 20)))`)
	e.products(t, 15)
	ss := session(t, e.store)
	big := claimOn(t, e, ss)
	require.Len(t, big.Events, 1, "past the byte bound: a batch of its own")
	require.True(t, big.More)
	behind := claimOn(t, e, ss)
	require.Len(t, behind.Events, 15, "the rows behind it, let go and claimed while it is out")
	_, _, _, err := ss.Next(e.ctx, []store.Finishing{{Claim: big, Accepted: big.IDs()}, {Claim: behind, Accepted: behind.IDs()}}, false)
	require.NoError(t, err)
	require.Empty(t, e.claimHolders(t))
	require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}

// TestASessionClaimsARowThatSharesAKeyWithItsClaimsOut: two pending rows
// whose claim locks have one key (hashtext collides), a batch apart. While
// the session's claim of the first is out, its next claim passes over the
// second as one of its own but does not take it, and counts it held (so
// that a drainer looks again); once the first is finished, the second is
// claimed.
func TestASessionClaimsARowThatSharesAKeyWithItsClaimsOut(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	e.productsBulk(t, 102)
	var first, second string
	require.NoError(t, e.pool.QueryRow(e.ctx, `WITH u AS (SELECT gen_random_uuid()::text AS id FROM generate_series(1, 400000))
		SELECT min(id), max(id) FROM u GROUP BY hashtext(id) HAVING count(*) > 1 LIMIT 1`).Scan(&first, &second))
	rows, err := e.pool.Query(e.ctx, `SELECT event_id::text FROM _ontology_replication_delivery ORDER BY revision, event_id`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, ids, 102)
	for old, id := range map[string]string{ids[0]: first, ids[101]: second} {
		e.exec(t, `UPDATE product_history SET id = $2 WHERE id = $1`, old, id)
		e.exec(t, `UPDATE _ontology_replication_delivery SET event_id = $2 WHERE event_id = $1`, old, id)
	}
	ss := session(t, e.store)
	out := claimOn(t, e, ss)
	require.Contains(t, out.IDs(), first)
	next := claimOn(t, e, ss)
	require.NotContains(t, next.IDs(), second, "the second row's key is the claim's out")
	require.Equal(t, 1, next.Held, "and it is held, not gone")
	_, _, after, err := ss.Next(e.ctx, []store.Finishing{{Claim: out, Accepted: out.IDs()}, {Claim: next, Accepted: next.IDs()}}, true)
	require.NoError(t, err)
	require.NotNil(t, after)
	require.Equal(t, []string{second}, after.IDs(), "claimed once the first is finished")
}
