package delivery

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/publish"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// EnvEmulatorHost is the Pub/Sub emulator address variable.
const EnvEmulatorHost = "PUBSUB_EMULATOR_HOST"

// Parts overrides the production parts Open builds (tests and the local
// mode fill some in).
type Parts struct {
	Publisher Publisher
	Warehouse *warehouse.BigQuery
	Logger    *slog.Logger
}

// Opened is a Service with the parts it owns.
type Opened struct {
	*Service
	Warehouse *warehouse.BigQuery
	close     []func()
}

// Close releases the database pools and clients.
func (o *Opened) Close() {
	for i := len(o.close) - 1; i >= 0; i-- {
		o.close[i]()
	}
}

// Open builds a Service over the registry with production parts: a pool per
// workspace, one Pub/Sub publisher (through the emulator when
// PUBSUB_EMULATOR_HOST is set) and the BigQuery warehouse.
func Open(ctx context.Context, reg *registry.Registry, getenv func(string) string, parts Parts) (*Opened, error) {
	o := &Opened{}
	pools := database.New(database.Config{})
	o.close = append(o.close, pools.Close)
	pub := parts.Publisher
	if pub == nil {
		p, err := publish.New(ctx, publish.Config{Project: reg.Workspaces[0].PubSub.Project, EmulatorHost: getenv(EnvEmulatorHost)})
		if err != nil {
			o.Close()
			return nil, err
		}
		o.close = append(o.close, func() { _ = p.Close() })
		pub = p
	}
	o.Warehouse = parts.Warehouse
	if o.Warehouse == nil {
		o.Warehouse = warehouse.NewBigQuery(warehouse.Config{})
		o.close = append(o.close, func() { _ = o.Warehouse.Close() })
	}
	svc, err := New(Config{Registry: reg, Pools: pools, Publisher: pub, Warehouse: o.Warehouse, Logger: parts.Logger})
	if err != nil {
		o.Close()
		return nil, fmt.Errorf("delivery: %w", err)
	}
	o.Service = svc
	return o, nil
}
