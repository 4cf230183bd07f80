package store_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestIDLists: the id lists take uuids in PostgreSQL's text form, in upper
// case or without hyphens, and refuse anything else with an error naming
// the id, changing nothing.
func TestIDLists(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 3)
	b, err := e.store.PendingEvents(e.ctx, tg)
	require.NoError(t, err)
	ids := b.IDs()
	for name, op := range map[string]func([]string) (int64, error){
		"acknowledge": func(ids []string) (int64, error) { return e.store.Acknowledge(e.ctx, tg, ids) },
		"verify":      func(ids []string) (int64, error) { return e.store.VerifyEvents(e.ctx, tg, ids) },
		"retry": func(ids []string) (int64, error) {
			requeued, err := e.store.RetryUnverified(e.ctx, tg, ids)
			return int64(len(requeued)), err
		},
	} {
		_, err := op([]string{ids[0], "not-a-uuid"})
		require.ErrorContains(t, err, `"not-a-uuid" is not a uuid`, name)
	}
	require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL"))
	require.Zero(t, e.count(t, "SELECT count(*) FROM _ontology_replication_receipts"))

	n, err := e.store.Acknowledge(e.ctx, tg, []string{strings.ToUpper(ids[0]), strings.ReplaceAll(ids[1], "-", ""), ids[2]})
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
}
