package delivery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/publish"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// Publisher publishes one batch as one request: all messages stored, one id
// each, or an error. *publish.Publisher is the implementation.
type Publisher interface {
	Publish(ctx context.Context, topic string, data [][]byte) ([]string, error)
}

// Warehouse looks accepted events up where they should have landed.
// *warehouse.BigQuery is the implementation.
type Warehouse interface {
	// Present returns which of the lookups' event ids the events table
	// holds: one query for all of them (at most warehouse.MaxLookupIDs).
	Present(ctx context.Context, table registry.BigQuery, lookups []warehouse.Lookup) ([]string, error)
}

// Config configures a Service.
type Config struct {
	// Registry is the workspace registry. Required.
	Registry *registry.Registry
	// Pools opens the workspaces' databases. Required.
	Pools *database.Pools
	// Publisher publishes batches. Required.
	Publisher Publisher
	// Warehouse looks events up in BigQuery. Required by Verify only.
	Warehouse Warehouse
	// DeadLetters reads dead-letter subscriptions. Required by DeadLetters
	// only.
	DeadLetters DeadLetterReader
	// Logger receives structured logs. Default: slog.Default().
	Logger *slog.Logger
	// Store configures each workspace's store (timeouts).
	Store store.Config
	// Views creates the latest-state views (`job views`). Required by
	// CreateViews only.
	Views ViewCreator
	// Auditor reads the warehouse's side of an audit (`job audit`, `job
	// repair`). Required by Audit and Repair only.
	Auditor Auditor
	// Retry bounds the retries of transient faults inside a command (drain
	// batches, backfill and replay pages).
	Retry RetryPolicy
	// TurnWait bounds a busy drainer's waits for the drainers of other
	// processes ahead of it in its workspace's turns: for the next turn,
	// and its claim's for the turn (see Drain in the package doc). A
	// holder that froze is ended by the server after the store's
	// IdleTimeout, shorter than this. Default: DefaultTurnWait.
	TurnWait time.Duration
	// Gather is how long a busy drainer that holds the next turn waits
	// before its claim, so that one batch takes the commits of the
	// wake-ups that come meanwhile, this process's and the others' (see
	// Drain): the database's cost per commit falls with it and the
	// latency grows by it. Negative turns it off. Default: DefaultGather.
	Gather time.Duration
	// QuietInterval is the mean time between this process's wake-ups of a
	// workspace at and above which the workspace is quiet: its drainer
	// claims at once, without the turns and the gathering (see Drain). The
	// mean weighs each new interval a third and counts a pause as 1 s at
	// most: a burst after a quiet spell is busy by its sixth wake-up, and
	// one pause of a second makes the workspace quiet again. Negative:
	// never quiet (every claim takes the turns). Default:
	// DefaultQuietInterval.
	QuietInterval time.Duration
	// BatchesOut bounds the batches a drainer has out at once, each one
	// Publish request, so that a workspace's delivery keeps up with a slow
	// Pub/Sub. Default: DefaultBatchesOut.
	BatchesOut int
	// RequeueReportAfter is how many times the verifier may send an event
	// back to pending before it reports it (VerifyResult.RequeuedRepeatedly).
	// Default: 3.
	RequeueReportAfter int
}

// DefaultGather is Config.Gather's default: long enough that at a few
// hundred commits a second one claim takes the commits of a dozen
// wake-ups, short enough that a commit is accepted within the SPEC's 100 ms
// p99 (PERFORMANCE.md has the trade measured at other values).
const DefaultGather = 85 * time.Millisecond

// DefaultQuietInterval is Config.QuietInterval's default: at rates where a
// gather would rarely coalesce anything, turns would cost a statement a
// claim for nothing.
const DefaultQuietInterval = 100 * time.Millisecond

// DefaultTurnWait is Config.TurnWait's default: longer than the store's
// IdleTimeout (15 s), after which the server ends a frozen holder, so a
// waiter gets the turn within its bound.
const DefaultTurnWait = 20 * time.Second

// DefaultBatchesOut is Config.BatchesOut's default: at 150 commits a second
// and every Publish held 1 s, a drainer claims every gather and has three
// or four batches out; more would only hold more connections' worth of
// events unacknowledged during an outage.
const DefaultBatchesOut = 4

// Service is the one orchestration of delivery: claim → publish →
// acknowledge, verification rounds and sweeps. The functions and the job
// all call it.
type Service struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	stores map[string]cachedStore

	requeues requeueCounts
	// drainers are this process's drainers, one per workspace with work
	// (see Wake).
	drainers *drainers
	// suspects are the events whose publish may fail for a reason of
	// their own (see suspects).
	suspects suspects
	// lastDone is when each workspace's verification last came to an end
	// (verified, inactive or failed) in a pass of this Service.
	lastDone map[string]time.Time
}

// cachedStore is a workspace's store over the pool it was built on.
type cachedStore struct {
	pool *pgxpool.Pool
	st   *store.Store
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Registry == nil:
		return errors.New("Registry is required")
	case c.Pools == nil:
		return errors.New("Pools is required")
	case c.Publisher == nil:
		return errors.New("Publisher is required")
	case c.BatchesOut < 0 || c.BatchesOut > 64:
		return fmt.Errorf("BatchesOut %d: must be between 1 and 64 (0: the default)", c.BatchesOut)
	case c.TurnWait < 0:
		return fmt.Errorf("TurnWait %v: must not be negative", c.TurnWait)
	case c.RequeueReportAfter < 0:
		return fmt.Errorf("RequeueReportAfter %d: must not be negative", c.RequeueReportAfter)
	}
	if err := c.Store.Validate(); err != nil {
		return fmt.Errorf("Store.%w", err)
	}
	// The drainer that gathers holds the next turn idle meanwhile: past
	// the store's IdleTimeout the server would end its session.
	if idle := cmp.Or(c.Store.IdleTimeout, store.DefaultIdleTimeout); c.Gather >= idle {
		return fmt.Errorf("Gather %v: must be shorter than Store.IdleTimeout (%v)", c.Gather, idle)
	}
	if err := c.Retry.Validate(); err != nil {
		return fmt.Errorf("Retry.%w", err)
	}
	return nil
}

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("delivery: invalid config: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.RequeueReportAfter == 0 {
		cfg.RequeueReportAfter = 3
	}
	cfg.TurnWait = cmp.Or(cfg.TurnWait, DefaultTurnWait)
	cfg.BatchesOut = cmp.Or(cfg.BatchesOut, DefaultBatchesOut)
	if cfg.Gather == 0 {
		cfg.Gather = DefaultGather
	}
	if cfg.QuietInterval == 0 {
		cfg.QuietInterval = DefaultQuietInterval
	}
	return &Service{cfg: cfg, log: log, stores: map[string]cachedStore{}, drainers: newDrainers()}, nil
}

// ErrUnknownWorkspace: the registry has no such workspace.
var ErrUnknownWorkspace = errors.New("unknown workspace")

// errPublish marks a failed Publish RPC.
var errPublish = errors.New("publish failed")

// Transient reports whether a failure may pass by itself (database or
// Pub/Sub unavailable, a timeout, a lock conflict, the server's connection
// budget in use): an HTTP caller gets 503, a command retries it
// (RetryPolicy).
// Other failures (a missing history row, a malformed event, a missing
// schema or topic, a login refused, a Cloud SQL instance whose settings
// refuse the connection) need a person: 500.
func Transient(err error) bool {
	if errors.Is(err, errPublish) {
		return !publish.Misconfigured(err)
	}
	if database.LoginRefused(err) || database.Misconfigured(err) {
		return false
	}
	return store.Retryable(err) || errors.Is(err, database.ErrServerBusy) || errors.Is(err, ErrShuttingDown)
}

// Workspace returns a workspace of the registry.
func (s *Service) Workspace(id string) (registry.Workspace, error) {
	ws, ok := s.cfg.Registry.Workspace(id)
	if !ok {
		return registry.Workspace{}, fmt.Errorf("%w %q", ErrUnknownWorkspace, id)
	}
	return ws, nil
}

// workspaceLease is a workspace's store in use: its database pool stays open until
// Release. It holds the store in a field, so that the store's methods are
// the Service's to call, never its callers'.
type workspaceLease struct {
	store *store.Store
	pool  *database.Lease
}

// Release ends the lease; the pool may then be closed when idle.
func (l *workspaceLease) Release() { l.pool.Release() }

// lease returns the workspace's store, opening its pool on first use (or
// again after it was closed when idle). The caller must Release it.
func (s *Service) lease(ctx context.Context, ws registry.Workspace) (*workspaceLease, error) {
	pl, err := s.cfg.Pools.Acquire(ctx, ws)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.stores[ws.ID]; ok && c.pool == pl.Pool {
		return &workspaceLease{store: c.st, pool: pl}, nil
	}
	cfg := s.cfg.Store
	if cfg.Logger == nil {
		cfg.Logger = s.log.With(slog.String("workspace", ws.ID))
	}
	st, err := store.New(pl.Pool, cfg)
	if err != nil {
		pl.Release()
		return nil, err
	}
	// One store per pool: a pool opened again gets a new store (its caches
	// start afresh).
	s.stores[ws.ID] = cachedStore{pool: pl.Pool, st: st}
	return &workspaceLease{store: st, pool: pl}, nil
}
