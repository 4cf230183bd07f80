// Package config reads, once at start-up, the settings both deployed
// binaries (the functions and the job) take from their environment: the
// workspace registry, the log level, a Pub/Sub emulator and the database
// pool size. Each error names the variable.
package config

import (
	"fmt"
	"log/slog"
	"strconv"

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
)

// Names lists every variable Read reads.
var Names = []string{registry.EnvInline, registry.EnvFile, EnvLogLevel, EnvEmulatorHost, EnvPoolSize}

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
}

// Read reads and checks the shared settings; defaultPoolSize is the
// component's pool size.
func Read(getenv func(string) string, defaultPoolSize int32) (Settings, error) {
	s := Settings{EmulatorHost: getenv(EnvEmulatorHost), PoolSize: defaultPoolSize}
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
	if s.Registry, err = registry.Load(getenv); err != nil {
		return Settings{}, err
	}
	return s, nil
}
