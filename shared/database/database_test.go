package database_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/pgtest"
	"github.com/segmentstream/ontology-replication/shared/registry"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestPoolPerWorkspace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t, nil)
	pools := database.New(database.Config{})
	defer pools.Close()
	ws := registry.Workspace{ID: "w1", Database: registry.Database{URL: url, MaxConns: 2}}
	a, err := pools.Pool(ctx, ws)
	require.NoError(t, err)
	b, err := pools.Pool(ctx, ws)
	require.NoError(t, err)
	require.Same(t, a, b, "one pool per workspace, reused")
	require.EqualValues(t, 2, a.Config().MaxConns)
	var app string
	require.NoError(t, a.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&app))
	require.Equal(t, "ontology-replication", app)
	other, err := pools.Pool(ctx, registry.Workspace{ID: "w2", Database: registry.Database{URL: url}})
	require.NoError(t, err)
	require.NotSame(t, a, other)
	require.EqualValues(t, registry.DefaultMaxConns, other.Config().MaxConns)

	_, err = pools.Pool(ctx, registry.Workspace{ID: "bad", Database: registry.Database{URL: "postgres://u:secret@[::1"}})
	require.ErrorContains(t, err, "workspace bad")
	require.NotContains(t, err.Error(), "secret")
}
