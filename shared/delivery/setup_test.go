package delivery_test

import (
	"context"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestOpen: Open builds a Service from a registry alone, its Pub/Sub
// clients through the emulator, opened at once or on first use
// (OnDemand), and refuses a config without a registry.
func TestOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, err := delivery.Open(ctx, delivery.OpenConfig{})
	require.ErrorContains(t, err, "Registry is required")

	r := newRig(t, 2)
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	_, err = srv.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/p1/topics/events"})
	require.NoError(t, err)
	reg, err := registry.Parse([]byte(`{"workspaces": [{"id": "w1", "database": {"url": "` + r.url + `"}, "pubsub": {"project": "p1", "topic": "events"}}]}`))
	require.NoError(t, err)
	for _, onDemand := range []bool{false, true} {
		o, err := delivery.Open(ctx, delivery.OpenConfig{Registry: reg, PubSubEmulatorHost: srv.Addr, OnDemand: onDemand, DeadLetterReader: true})
		require.NoError(t, err)
		require.NoError(t, sdkfixture.BulkCreate(ctx, r.pool, sdkfixture.Demo, "product", "title", 3, 3))
		res, err := o.DrainAll(ctx, "w1", delivery.DrainAllOptions{})
		require.NoError(t, err, "on demand: %v", onDemand)
		require.Equal(t, 3, res.Published)
		o.Close()
	}
	require.Len(t, srv.Messages(), 6)
}
