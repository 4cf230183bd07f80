package store_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

func TestStateAndTargets(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	paused, err := e.store.State(e.ctx)
	require.NoError(t, err)
	require.Equal(t, store.State{Version: 4, SourceID: paused.SourceID}, paused, "paused, no generation")
	_, _, err = e.store.ActiveTarget(e.ctx)
	require.ErrorIs(t, err, store.ErrNoActiveTarget)

	tg := e.start(t)
	require.Equal(t, e.gen.Generation, tg.Generation)
	require.Equal(t, e.gen.SourceID, tg.SourceID)
	require.Equal(t, 4, tg.Protocol)
	require.True(t, tg.UsesDelivery())
	require.Len(t, tg.Selection, 3)
	require.Equal(t, []string{"products"}, tg.Selection[2].Relationships)
	again, err := e.store.Target(e.ctx, tg.Generation)
	require.NoError(t, err)
	require.Equal(t, tg, again)

	for _, bad := range []string{"00000000-0000-4000-8000-000000000000", "not-a-uuid"} {
		_, err = e.store.Target(e.ctx, bad)
		require.ErrorIs(t, err, store.ErrUnknownGeneration, bad)
	}
}

// TestSchemaErrors: a database without the replication schema, with an
// empty singleton table, or at an unknown protocol version is refused with
// the error naming it, by the state read and by a drain's claim alike.
func TestSchemaErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	both := func(want error, msg string) {
		t.Helper()
		_, err := e.store.State(e.ctx)
		require.ErrorIs(t, err, want, msg)
		require.False(t, store.Retryable(err))
		_, _, c, err := e.store.ClaimActive(e.ctx)
		require.ErrorIs(t, err, want, "claim: %s", msg)
		require.Nil(t, c)
	}
	both(store.ErrNoSchema, "no schema")
	e.exec(t, `CREATE TABLE _ontology_replication (id boolean PRIMARY KEY DEFAULT true, version integer NOT NULL,
		source_id uuid NOT NULL DEFAULT gen_random_uuid(), enabled boolean NOT NULL DEFAULT false, active_generation uuid)`)
	both(store.ErrNoSchema, "no singleton row")
	e.exec(t, `INSERT INTO _ontology_replication (version) VALUES (5)`)
	both(store.ErrUnsupportedProtocol, "version 5")
	_, err := e.store.State(e.ctx)
	require.ErrorContains(t, err, "version 5")
}
