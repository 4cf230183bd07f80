package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is what the store runs its statements on: a *pgxpool.Pool. Acquire
// gives a claim a session of its own (see Claim); Exec runs the one
// statement that cannot run in a transaction, the periodic VACUUM of the
// target table.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Config configures a Store.
type Config struct {
	// StatementTimeout bounds every statement (SET LOCAL statement_timeout).
	// Default: 30s, as the SDK's lifecycle code.
	StatementTimeout time.Duration
	// LockTimeout bounds every lock wait (SET LOCAL lock_timeout).
	// Default: 5s, as the SDK's lifecycle code.
	LockTimeout time.Duration
	// IdleTimeout is the idle_session_timeout of a session while it holds
	// any of the drain's locks — claims, the drain's turn or its next turn
	// (see Claims and Turns in the package doc) —, set by the statement
	// that takes the first and put back when the session lets them go: a
	// drain that freezes while it holds them (its instance stopped, or cut
	// off from the network) is ended by the server this long after its last
	// statement, which frees them for the drains that are alive. A live
	// holder never meets it, however long its publish takes: it touches
	// its session every IdleTimeout/3 while it holds them (Session.Touch,
	// and a claim on a connection of its own by itself). Default:
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// SetAsideBackoff is how long an event that cannot be published is first
	// set aside; each later time doubles it. Default: 1m.
	SetAsideBackoff time.Duration
	// SetAsideMaxBackoff bounds the set-aside backoff. Default: 1h.
	SetAsideMaxBackoff time.Duration
	// AuditPageEvents is how many events one page of an audit's source
	// read takes (see AuditSource). Default: DefaultAuditPageEvents.
	AuditPageEvents int
	// AuditFenceTimeout bounds an audit's wait for the transactions that
	// were open when its watermark was read (see AuditMark). Default: 1m.
	AuditFenceTimeout time.Duration
	// Logger receives the store's warnings: a failed VACUUM of the target
	// table (see TargetVacuumEvery). Default: slog.Default().
	Logger *slog.Logger
}

// DefaultIdleTimeout is Config.IdleTimeout's default: long enough that a
// touch every 5 s keeps a live holder's session through a machine's
// hiccups, short enough that a frozen holder's claims are free again well
// within the SDK's own 30 s bounds.
const DefaultIdleTimeout = 15 * time.Second

func (c Config) withDefaults() Config {
	c.StatementTimeout = cmp.Or(c.StatementTimeout, 30*time.Second)
	c.LockTimeout = cmp.Or(c.LockTimeout, 5*time.Second)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, DefaultIdleTimeout)
	c.SetAsideBackoff = cmp.Or(c.SetAsideBackoff, time.Minute)
	c.SetAsideMaxBackoff = cmp.Or(c.SetAsideMaxBackoff, time.Hour)
	c.AuditPageEvents = cmp.Or(c.AuditPageEvents, DefaultAuditPageEvents)
	c.AuditFenceTimeout = cmp.Or(c.AuditFenceTimeout, time.Minute)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports the first invalid field (a zero field takes its
// default).
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.StatementTimeout < time.Millisecond:
		return fmt.Errorf("StatementTimeout %v: must be at least 1ms", c.StatementTimeout)
	case c.LockTimeout < time.Millisecond:
		return fmt.Errorf("LockTimeout %v: must be at least 1ms", c.LockTimeout)
	case c.IdleTimeout < time.Second:
		return fmt.Errorf("IdleTimeout %v: must be at least 1s", c.IdleTimeout)
	case c.SetAsideBackoff < time.Second:
		// The seed's retry sets next_verify_at 30 s ahead; a set-aside
		// backoff of 30 s could not be told from it.
		return fmt.Errorf("SetAsideBackoff %v: must be at least 1s", c.SetAsideBackoff)
	case c.SetAsideBackoff%time.Millisecond != 0 || c.SetAsideMaxBackoff%time.Millisecond != 0:
		// A set-aside's interval carries its reason's tag in the
		// microseconds below its backoff (reasonTag).
		return fmt.Errorf("SetAsideBackoff %v and SetAsideMaxBackoff %v: must be whole milliseconds", c.SetAsideBackoff, c.SetAsideMaxBackoff)
	case c.SetAsideMaxBackoff < c.SetAsideBackoff:
		return fmt.Errorf("SetAsideMaxBackoff %v: must be at least SetAsideBackoff (%v)", c.SetAsideMaxBackoff, c.SetAsideBackoff)
	case c.AuditPageEvents < 1:
		return fmt.Errorf("AuditPageEvents %d: must be at least 1", c.AuditPageEvents)
	case c.AuditFenceTimeout < time.Millisecond:
		return fmt.Errorf("AuditFenceTimeout %v: must be at least 1ms", c.AuditFenceTimeout)
	}
	// A set-aside is told from the seed's own writes by its interval alone
	// (sqlClaimable), so no backoff the store can write may equal one that a
	// seed statement leaves on a pending row: every step of the doubling, in
	// the microseconds the statements compare.
	for _, us := range setAsideBackoffs(c.SetAsideBackoff, c.SetAsideMaxBackoff) {
		for seed, statement := range seedIntervals {
			if us == seed.Microseconds() {
				return fmt.Errorf("SetAsideBackoff %v and SetAsideMaxBackoff %v: the backoff reaches %v, the interval the seed's %s leaves; choose another",
					c.SetAsideBackoff, c.SetAsideMaxBackoff, time.Duration(us)*time.Microsecond, statement)
			}
		}
	}
	return nil
}

// seedIntervals are the intervals next_verify_at − last_checked_at that
// the seed's statements leave on a delivery row with next_verify_at in the
// future, with the statement: its retry (retryUnverifiedReplicationV4)
// moves next_verify_at 30 s past last_checked_at, and a row it sends back
// to pending keeps them. The acknowledgement, replay and backfill set
// next_verify_at to now(), never in the future by the time a claim reads
// it, and the verification sets verified_at, which no claim reads. Read
// only.
var seedIntervals = map[time.Duration]string{30 * time.Second: "verification retry (retryUnverifiedReplicationV4)"}

// Store runs the replication protocol's statements against one ontology
// database. It is safe for concurrent use.
type Store struct {
	db       DB
	cfg      Config
	backoffs []int64 // the set-aside backoffs, in microseconds
	// waitedBefore is, for each of backoffs, the backoffs an event waited
	// before it (see waitedBefore).
	waitedBefore []int64

	mu      sync.Mutex
	capture *captureTables // cached; reloaded when a table is not found
	// reads are the history tables whose events claims read in their own
	// statement (bare names, at most maxReadTables; see sqlCandidates).
	reads []string

	// legacy remembers that the database was at protocol 3 when last read,
	// so that a claim sends the statements of that protocol first.
	legacy atomic.Bool
	// legacyAside keeps a protocol-3 database's set-aside events.
	legacyAside legacyAside

	// targetUpdates counts backfill and replay pages, each of which
	// updates a target row (see TargetVacuumEvery).
	targetUpdates atomic.Int64
	// mayVacuum caches whether this role may VACUUM the target table.
	mayVacuum atomic.Pointer[bool]

	// beforeRelease, set by tests only, runs before a claim on a
	// connection of its own releases its locks.
	beforeRelease func()
}

// Legacy reports whether the database was at protocol 3 when the store
// last read it (a claim's first round trip tells; see ClaimActive).
func (s *Store) Legacy() bool { return s.legacy.Load() }

// New returns a Store over db.
func New(db DB, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("store: invalid config: %w", err)
	}
	if db == nil {
		return nil, errors.New("store: no database")
	}
	backoffs := taggedIntervals(setAsideBackoffs(cfg.SetAsideBackoff, cfg.SetAsideMaxBackoff))
	return &Store{db: db, cfg: cfg, backoffs: backoffs, waitedBefore: waitedBefore(backoffs)}, nil
}

// Errors callers branch on.
var (
	// ErrNoSchema: the replication schema is not installed in the database.
	ErrNoSchema = errors.New("the replication schema is not installed (run the ontology SDK migration)")
	// ErrUnsupportedProtocol: the singleton's version is neither 3 nor 4.
	ErrUnsupportedProtocol = errors.New("unsupported replication protocol version")
	// ErrNoActiveTarget: replication has no active generation.
	ErrNoActiveTarget = errors.New("replication has no active target")
	// ErrUnknownGeneration: no target has the generation.
	ErrUnknownGeneration = errors.New("unknown replication generation")
	// ErrMissingHistory: a queued event's history (or baseline) row is gone.
	ErrMissingHistory = errors.New("a queued replication event is missing from retained history")
	// ErrNotCaptured: a queued event's history row holds no captured event
	// (its replication column is NULL).
	ErrNotCaptured = errors.New("a queued replication event's history row holds no captured event (its replication column is NULL)")
	// ErrNoCaptureTable: a selected entity or a queued event names a table
	// that has no capture trigger.
	ErrNoCaptureTable = errors.New("no history table with a capture trigger")
	// ErrBaselineIncomplete: the target's baseline is not complete; its
	// advancement belongs to the SDK.
	ErrBaselineIncomplete = errors.New("the target's baseline is incomplete (the SDK advances it)")
)

// Retryable reports whether err is a failure a later attempt may not meet:
// a lost or refused connection, a timeout, a lock or serialization conflict,
// or a server shutting down. Protocol errors (a missing history row, a
// malformed event, a missing schema) are not.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		code := pgErr.SQLState()
		switch class := code[:min(2, len(code))]; {
		case class == "08", class == "53", class == "57", class == "58":
			return true // connection, resources, operator intervention (timeouts, shutdown), system
		case code == "40001", code == "40P01", code == "55P03", code == "25P03":
			return true // serialization, deadlock, lock timeout, idle-in-transaction timeout
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	// The connection lost mid-statement with no word from the server (an
	// instance restarting, a proxy or the network dropping it): the server
	// rolls the transaction back unless what was lost was its COMMIT's
	// answer, and every store step is one a later attempt may run after
	// either (it reads the state the first left), as after a class 08
	// error, which may also come after a COMMIT was sent.
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	return errors.Is(err, pgx.ErrTxClosed) || pgconn.SafeToRetry(err)
}

// begin opens a transaction with the store's statement and lock timeouts set
// locally, as the SDK's lifecycle code does; with keyOrder, also the plan
// settings of sqlSetKeyOrder.
func (s *Store) begin(ctx context.Context, db beginner, keyOrder bool) (pgx.Tx, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	q := sqlSetTimeouts
	if keyOrder {
		q = sqlSetKeyOrder
	}
	if _, err := tx.Exec(ctx, q, ms(s.cfg.StatementTimeout), ms(s.cfg.LockTimeout)); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return tx, nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%dms", d.Milliseconds()) }

// inTx runs fn in a transaction with the store's timeouts and commits it.
// When a cached history table has gone (undefined_table: an entity renamed
// under a running Store), it forgets the cache and runs fn once more.
func (s *Store) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return s.retryRenamed(func() error { return s.inTxOnce(ctx, s.db, false, fn) })
}

// inKeyOrderTx is inTx for a transaction that updates a set of delivery
// rows: see sqlSetKeyOrder.
func (s *Store) inKeyOrderTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return s.retryRenamed(func() error { return s.inTxOnce(ctx, s.db, true, fn) })
}

func (s *Store) retryRenamed(run func() error) error {
	err := run()
	if err != nil && undefinedTable(err) && s.forgetCaptureTables() {
		err = run()
	}
	return err
}

// beginner starts transactions: the Store's pool, or one of its sessions.
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// inTxOnce runs fn in a transaction of db with the store's timeouts and
// commits it.
func (s *Store) inTxOnce(ctx context.Context, db beginner, keyOrder bool, fn func(tx pgx.Tx) error) error {
	tx, err := s.begin(ctx, db, keyOrder)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// sqlSetTimeouts sets the transaction's statement and lock timeouts (the
// SDK's SET LOCAL statement_timeout = '30s'; SET LOCAL lock_timeout = '5s',
// with the values as bind parameters).
const sqlSetTimeouts = `SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true)`

// sqlSetKeyOrder is sqlSetTimeouts for a transaction that updates a set of
// delivery rows (acknowledge, set aside, verify, retry, a replay page); it
// also turns sequential and bitmap scans off, so that each such statement
// finds its rows by the primary key (generation, event_id) and so locks them
// in key order. Acknowledgements, replay pages and the verifier's retries can
// want the same rows at once; locked in the same order, they wait for each
// other instead of deadlocking (a bitmap scan locks them in the table's
// physical order). Every such statement matches its rows with a state
// predicate no partial index has (see Finding rows by key in the package doc),
// so the primary key is the only index it can use.
const sqlSetKeyOrder = `SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true),
  set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)`

// sqlShareLifecycle is shareReplicationLifecycle (transaction.js, seed 000):
// writers, acknowledgement and backfill pages hold it shared; lifecycle
// changes (pause, replay initialisation, migrations) take it exclusively.
const sqlShareLifecycle = `SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))`

// sqlLockLifecycle is lockReplicationLifecycle (transaction.js, seed 000):
// the singleton row first, as legacy writers take it, then the exclusive
// advisory lock. Every lifecycle operation keeps that order.
const (
	sqlLockSingleton = `SELECT id FROM _ontology_replication WHERE id FOR UPDATE`
	sqlLockLifecycle = `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`
)

// LifecycleLock is the SDK's REPLICATION_LIFECYCLE_LOCK.
const LifecycleLock = "segmentstream.ontology.replication.lifecycle"
