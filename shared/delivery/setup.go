package delivery

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/deadletter"
	"github.com/segmentstream/ontology-replication/shared/publish"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// OpenConfig is what Open builds a Service from.
type OpenConfig struct {
	// Registry is the workspace registry. Required.
	Registry *registry.Registry
	// PubSubEmulatorHost is a Pub/Sub emulator's address (the value of
	// PUBSUB_EMULATOR_HOST); empty for Pub/Sub itself.
	PubSubEmulatorHost string
	// Pools configures the workspace pools (size, how many open at once,
	// idle close).
	Pools database.Config
	// Store configures each workspace's store.
	Store store.Config
	// Retry bounds the retries of transient faults inside a command.
	Retry RetryPolicy
	// Gather, QuietInterval and BatchesOut are Config's (a busy drainer's
	// wait before a claim; what a quiet workspace is; the batches a drainer
	// has out at once).
	Gather, QuietInterval time.Duration
	BatchesOut            int
	// Publisher and Warehouse replace the production parts (tests and the
	// local mode); nil builds them.
	Publisher   Publisher
	Warehouse   *warehouse.BigQuery
	DeadLetters DeadLetterReader
	// Views creates the latest-state views (nil: the BigQuery warehouse;
	// the local mode's warehouse is another).
	Views ViewCreator
	// DeadLetterReader builds a reader of the dead-letter subscriptions
	// when DeadLetters is nil (only `job dead-letter` reads them).
	DeadLetterReader bool
	// OnDemand opens the Pub/Sub publisher and dead-letter reader on their
	// first use rather than here (the job: its read-only commands then
	// need no Pub/Sub credentials). The services open theirs at start-up,
	// so that a missing credential fails the deployment, not a wake-up.
	OnDemand bool
	// Logger receives the service's logs. Default: slog.Default().
	Logger *slog.Logger
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

// openNow opens a client at once unless onDemand, closing what is open on
// a failure.
func openNow[T any](o *Opened, onDemand bool, get func() (T, error)) error {
	if onDemand {
		return nil
	}
	if _, err := get(); err != nil {
		o.Close()
		return err
	}
	return nil
}

// Open builds a Service over the registry with production parts: a pool per
// workspace, one Pub/Sub publisher (through the emulator when
// PubSubEmulatorHost is set) and the BigQuery warehouse.
func Open(ctx context.Context, cfg OpenConfig) (*Opened, error) {
	if cfg.Registry == nil {
		return nil, fmt.Errorf("delivery: invalid config: Registry is required")
	}
	log := cmp.Or(cfg.Logger, slog.Default())
	for _, ws := range cfg.Registry.Workspaces {
		if ws.BigQuery.Endpoint != "" {
			log.WarnContext(ctx, "replication: a workspace's BigQuery lookups go to the registry's endpoint, unauthenticated: right for a local or test server only",
				slog.String("workspace", ws.ID), slog.String("endpoint", ws.BigQuery.Endpoint), slog.Bool("remote_allowed", ws.BigQuery.AllowRemoteEndpoint))
		}
	}
	o := &Opened{}
	pools, err := database.New(cfg.Pools)
	if err != nil {
		return nil, err
	}
	o.close = append(o.close, pools.Close)
	project := cfg.Registry.Workspaces[0].PubSub.Project
	pub := cfg.Publisher
	if pub == nil {
		p := newOnDemandPublisher(ctx, publish.Config{Project: project, EmulatorHost: cfg.PubSubEmulatorHost})
		o.close = append(o.close, p.Close)
		if err := openNow(o, cfg.OnDemand, p.get); err != nil {
			return nil, err
		}
		pub = p
	}
	o.Warehouse = cfg.Warehouse
	if o.Warehouse == nil {
		wh, err := warehouse.NewBigQuery(warehouse.Config{})
		if err != nil {
			o.Close()
			return nil, err
		}
		o.Warehouse = wh
		o.close = append(o.close, func() { _ = wh.Close() })
	}
	dead := cfg.DeadLetters
	if dead == nil && cfg.DeadLetterReader {
		r := newOnDemandDeadLetters(ctx, deadletter.Config{Project: project, EmulatorHost: cfg.PubSubEmulatorHost})
		o.close = append(o.close, r.Close)
		if err := openNow(o, cfg.OnDemand, r.get); err != nil {
			return nil, err
		}
		dead = r
	}
	svc, err := New(Config{Registry: cfg.Registry, Pools: pools, Publisher: pub, Warehouse: o.Warehouse, Views: cmp.Or[ViewCreator](cfg.Views, o.Warehouse), Auditor: o.Warehouse, DeadLetters: dead, Logger: cfg.Logger, Store: cfg.Store, Retry: cfg.Retry, Gather: cfg.Gather, QuietInterval: cfg.QuietInterval,
		BatchesOut: cfg.BatchesOut})
	if err != nil {
		o.Close()
		return nil, err
	}
	o.Service = svc
	return o, nil
}
