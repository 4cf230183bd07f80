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
	// DrainFor is how long a drain goes on publishing batches while more
	// events are pending, counted from its first claim, before it leaves
	// them to a drain that claimed after it, when there is one (see Drain):
	// within the SDK's 5 s for a wake-up. Default: 2s.
	DrainFor time.Duration
	// RequeueFor bounds, from a drain's start, how long it goes on queueing
	// for its turn again after transient faults (see Drain); the request's
	// own deadline bounds it too. Default: 25s.
	RequeueFor time.Duration
	// TurnWait bounds each of a wake-up's waits for the drains of its
	// workspace ahead of it: for the drain that is next to claim, and its
	// claim's for the drain in progress to end its turn (see Drain).
	// Default: 20s.
	TurnWait time.Duration
	// Gather is how long the drain that claims next waits before its
	// claim while its workspace is busy, so that one batch takes the
	// commits of the wake-ups that come meanwhile (see Drain): the
	// database's cost per commit falls with it and the latency grows by
	// it. Negative turns it off. Default: DefaultGather.
	Gather time.Duration
	// QuietInterval is the mean time between this process's wake-ups of a
	// workspace at and above which the workspace is quiet: its wake-ups
	// claim on their own, without turns (see Drain). The mean weighs each
	// new interval a third and counts a pause as 1 s at most: a burst after
	// a quiet spell is busy by its sixth wake-up, and one pause of a second
	// makes the workspace quiet again. Negative: never quiet (every
	// wake-up takes turns). Default: DefaultQuietInterval.
	QuietInterval time.Duration
	// RequeueReportAfter is how many times the verifier may send an event
	// back to pending before it reports it (VerifyResult.RequeuedRepeatedly).
	// Default: 3.
	RequeueReportAfter int
}

// DefaultGather is Config.Gather's default: on the development machine, at
// 150 commits a second over four instances, the wake-up path then costs the
// database 0.27–0.30× the SDK writer's own CPU per commit (the SPEC's bar
// is 0.3×), for a median commit → accepted of about 46 ms and a p99 of
// about 88 ms (the SPEC's is 100 ms; at 500 commits/s 88 ms too); 75 ms
// cost about 0.33–0.40× for 41 / 78 ms and 25 ms about 0.6× for 15 / 31 ms,
// measured before the claim took the turn itself, which saved about 10 %
// (README, Performance: BenchmarkWakeUps).
const DefaultGather = 85 * time.Millisecond

// DefaultQuietInterval is Config.QuietInterval's default: at rates where a
// gather would rarely coalesce anything, turns would cost a statement a
// wake-up for nothing.
const DefaultQuietInterval = 100 * time.Millisecond

// Service is the one orchestration of delivery: claim → publish →
// acknowledge, verification rounds and sweeps. The functions and the job
// all call it.
type Service struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	stores map[string]cachedStore

	requeues requeueCounts
	// turns counts this process's drains waiting for their workspace's
	// turn (see Drain).
	turns turns
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
	case c.DrainFor < 0:
		return fmt.Errorf("DrainFor %v: must not be negative", c.DrainFor)
	case c.RequeueFor < 0:
		return fmt.Errorf("RequeueFor %v: must not be negative", c.RequeueFor)
	case c.TurnWait < 0:
		return fmt.Errorf("TurnWait %v: must not be negative", c.TurnWait)
	case c.RequeueReportAfter < 0:
		return fmt.Errorf("RequeueReportAfter %d: must not be negative", c.RequeueReportAfter)
	}
	if err := c.Store.Validate(); err != nil {
		return fmt.Errorf("Store.%w", err)
	}
	// The drain that gathers holds the next turn idle meanwhile: past the
	// store's TurnIdleTimeout the server would end its session.
	if idle := cmp.Or(c.Store.TurnIdleTimeout, store.DefaultTurnIdleTimeout); c.Gather >= idle {
		return fmt.Errorf("Gather %v: must be shorter than Store.TurnIdleTimeout (%v)", c.Gather, idle)
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
	cfg.DrainFor = cmp.Or(cfg.DrainFor, 2*time.Second)
	cfg.TurnWait = cmp.Or(cfg.TurnWait, 20*time.Second)
	cfg.RequeueFor = cmp.Or(cfg.RequeueFor, 25*time.Second)
	if cfg.Gather == 0 {
		cfg.Gather = DefaultGather
	}
	if cfg.QuietInterval == 0 {
		cfg.QuietInterval = DefaultQuietInterval
	}
	return &Service{cfg: cfg, log: log, stores: map[string]cachedStore{}}, nil
}

// ErrUnknownWorkspace: the registry has no such workspace.
var ErrUnknownWorkspace = errors.New("unknown workspace")

// ErrDrainRetrying answers a wake-up coalesced into its process's pending
// drain while that drain waits to queue again after a transient fault: the
// commit is left to that drain, which may still publish it, but no 2xx is
// given on its word (an HTTP caller gets 503, which the SDK logs as
// deferred).
var ErrDrainRetrying = errors.New("the workspace's drain is retrying after a transient fault; this commit is left to it")

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
	return store.Retryable(err) || errors.Is(err, database.ErrServerBusy) || errors.Is(err, ErrDrainRetrying)
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

// Registry returns the registry the service serves.
func (s *Service) Registry() *registry.Registry { return s.cfg.Registry }
