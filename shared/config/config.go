// Package config reads, once at start-up, the settings both deployed
// binaries (the functions and the job) take from their environment: the
// workspace registry, the log level, a Pub/Sub emulator and the database
// pool size. Each error names the variable.
//
// The variables: LOG_LEVEL (DEBUG, INFO,
// WARN, ERROR); DATABASE_POOL_SIZE (each workspace pool's connections in this
// process: 2 for the drain and the verifier, 4 for the job);
// DATABASE_MAX_OPEN_POOLS (the workspace pools a process keeps open at once,
// the least recently used idle one closed past it: 64 for the functions,
// --parallel for the job); DATABASE_SERVER_MAX_CONNS (this process's
// connections to one PostgreSQL server, however many workspace databases live
// there and however it is addressed: 8); REPLICATION_RETRY_BUDGET (how long a
// job command retries a step through a transient fault: 2m); DRAIN_GATHER (the
// drain's wait before a claim on a busy workspace: 85ms, 0 turns it off, at
// most 1s; PERFORMANCE.md has what each costs); DRAIN_QUIET_INTERVAL (an
// instance's mean time between a workspace's wake-ups at and above which they
// claim on their own: 100ms; the mean weighs each new interval a third, so a
// burst after a quiet spell takes turns from about its sixth wake-up on each
// instance and one pause of a second makes the workspace quiet again; 0 makes
// every wake-up take turns); VERIFY_TIME_BUDGET, VERIFY_SWEEP_BATCHES,
// VERIFY_WORKERS (the verifier's pass: see the README's Interfaces);
// VERIFY_CALLER and VERIFY_AUDIENCE (the one account whose Google OIDC token
// the verifier accepts, and the audience it must name: the scheduler's account
// and the service's URL, which terraform sets; the verifier refuses to start
// without them unless VERIFY_CALLER_CHECK=off, which the local mode sets);
// PUBSUB_EMULATOR_HOST; FUNCTION_TARGET (Drain or Verify) and PORT for
// functions/cmd.
package config

import (
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/segmentstream/ontology-replication/shared/logging"
	"github.com/segmentstream/ontology-replication/shared/registry"
)

// The environment variables Read reads.
const (
	// EnvLogLevel is the log level: DEBUG, INFO (default), WARN or ERROR.
	EnvLogLevel = "LOG_LEVEL"
	// EnvEmulatorHost is a Pub/Sub emulator's address (the Pub/Sub client
	// honours it too).
	EnvEmulatorHost = "PUBSUB_EMULATOR_HOST"
	// EnvPoolSize is each workspace pool's size in this process, unless a
	// workspace's registry entry sets database.max_conns. Default: the
	// component's (2 for the drain and the verifier, 4 for the job).
	EnvPoolSize = "DATABASE_POOL_SIZE"
	// EnvMaxOpenPools bounds the workspace pools open at once in this
	// process (past it, the least recently used idle pool is closed): with
	// DATABASE_POOL_SIZE, the bound on this process's connections across
	// the fleet. Default: the component's (64 for the functions; the job's
	// --parallel).
	EnvMaxOpenPools = "DATABASE_MAX_OPEN_POOLS"
	// EnvServerMaxConns bounds this process's connections to one
	// PostgreSQL server (a Cloud SQL instance, or a host and port), however
	// many workspace databases live there. Default: 8
	// (database.DefaultServerMaxConns).
	EnvServerMaxConns = "DATABASE_SERVER_MAX_CONNS"
	// EnvRetryBudget bounds how long a job command retries a step that
	// meets a transient fault (Pub/Sub or the database unavailable, a
	// deadlock) before it fails with the cause, as a Go duration from 1s
	// to 1h. Default: 2m (delivery.RetryPolicy).
	EnvRetryBudget = "REPLICATION_RETRY_BUDGET"
	// EnvProject is the Google Cloud project the process runs in, which
	// log lines name in their trace (terraform sets it).
	EnvProject = "GOOGLE_CLOUD_PROJECT"
)

// JobEnvNames lists every variable the job reads: Read's, the task
// variables Cloud Run sets itself, and its log format.
var JobEnvNames = append(slices.Clone(EnvNames), "CLOUD_RUN_TASK_INDEX", "CLOUD_RUN_TASK_COUNT", EnvLogFormat)

// EnvLogFormat is how the job writes its log lines: "json" (Cloud
// Logging's shape), "text" (for a person), or empty: text on a terminal,
// JSON anywhere else (a Cloud Run execution, a pipe, a file).
const EnvLogFormat = "LOG_FORMAT"

// EnvNames lists every variable Read reads.
var EnvNames = []string{registry.EnvInline, registry.EnvFile, EnvLogLevel, EnvEmulatorHost, EnvPoolSize, EnvMaxOpenPools, EnvServerMaxConns, EnvRetryBudget, EnvProject}

// Settings are the shared settings.
type Settings struct {
	// Registry is the workspace registry (REPLICATION_WORKSPACES or
	// REPLICATION_WORKSPACES_FILE).
	Registry *registry.Registry
	// LogLevel is LOG_LEVEL's level.
	LogLevel slog.Level
	// EmulatorHost is PUBSUB_EMULATOR_HOST.
	EmulatorHost string
	// PoolSize is DATABASE_POOL_SIZE, or the component's default.
	PoolSize int32
	// MaxOpenPools is DATABASE_MAX_OPEN_POOLS; 0 when unset (the
	// component's default applies).
	MaxOpenPools int
	// ServerMaxConns is DATABASE_SERVER_MAX_CONNS; 0 when unset (the
	// default applies).
	ServerMaxConns int
	// RetryBudget is REPLICATION_RETRY_BUDGET; 0 when unset.
	RetryBudget time.Duration
	// ProjectID is GOOGLE_CLOUD_PROJECT.
	ProjectID string
}

// Read reads and checks the shared settings; defaultPoolSize is the
// component's pool size.
func Read(getenv func(string) string, defaultPoolSize int32) (Settings, error) {
	s := Settings{EmulatorHost: getenv(EnvEmulatorHost), PoolSize: defaultPoolSize, ProjectID: getenv(EnvProject)}
	var err error
	if s.LogLevel, err = logging.ParseLevel(getenv(EnvLogLevel)); err != nil {
		return Settings{}, fmt.Errorf("%s: %w", EnvLogLevel, err)
	}
	if raw := getenv(EnvPoolSize); raw != "" {
		n, err := strconv.ParseInt(raw, 10, 32)
		if err != nil || n < 1 || n > 32 {
			return Settings{}, fmt.Errorf("%s: %q must be a whole number from 1 to 32", EnvPoolSize, raw)
		}
		s.PoolSize = int32(n)
	}
	if raw := getenv(EnvMaxOpenPools); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > 100_000 {
			return Settings{}, fmt.Errorf("%s: %q must be a whole number from 1 to 100000", EnvMaxOpenPools, raw)
		}
		s.MaxOpenPools = n
	}
	if raw := getenv(EnvServerMaxConns); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > 10_000 {
			return Settings{}, fmt.Errorf("%s: %q must be a whole number from 1 to 10000", EnvServerMaxConns, raw)
		}
		s.ServerMaxConns = n
	}
	if raw := getenv(EnvRetryBudget); raw != "" {
		d, err := time.ParseDuration(raw)
		if err != nil || d < time.Second || d > time.Hour {
			return Settings{}, fmt.Errorf("%s: %q must be a duration from 1s to 1h (for example 2m)", EnvRetryBudget, raw)
		}
		s.RetryBudget = d
	}
	if s.Registry, err = registry.Load(getenv); err != nil {
		return Settings{}, err
	}
	return s, nil
}
