package database

import (
	"cmp"
	"fmt"
	"time"

	"cloud.google.com/go/cloudsqlconn"
	"github.com/jackc/pgx/v5"
)

// Config configures Pools.
type Config struct {
	// ApplicationName is reported to PostgreSQL (pg_stat_activity), so the
	// SDK's owners can tell this project's connections from theirs.
	// Default: "ontology-replication".
	ApplicationName string
	// MaxConns is a workspace pool's size, unless the workspace's registry
	// entry sets database.max_conns. Default: 2.
	MaxConns int32
	// MaxOpen bounds the workspace pools open at once: past it, Acquire
	// closes the least recently used pool nobody holds, or waits for one to
	// be released. 0 means no bound.
	MaxOpen int
	// IdleTimeout closes a workspace pool nobody has held for this long.
	// Negative closes it as soon as its last lease is released. Default: 5m.
	IdleTimeout time.Duration
	// ConnIdleTimeout closes a connection idle for this long, which keeps
	// it below the store's idle_session_timeout. Default: 30s.
	ConnIdleTimeout time.Duration
	// DialerOptions are extra cloudsqlconn options (tests). IAM login and
	// lazy refresh are always on.
	DialerOptions []cloudsqlconn.Option
	// Tracer, when set, traces every query of every pool (benchmarks count
	// round trips with it).
	Tracer pgx.QueryTracer
	// OnConnect and OnClose, when set, see every connection opened and
	// closed (tests count connections with them).
	OnConnect, OnClose func()
	// ServerMaxConns bounds this process's connections to one PostgreSQL
	// server, however many workspace databases live there: PostgreSQL's
	// max_connections is per server (one Cloud SQL instance holds many
	// workspace databases). A connection past it first closes an idle
	// connection of another workspace on the same server; otherwise it
	// waits, at most the connect timeout, for one to close. Workspaces are
	// on one server when they name the same Cloud SQL instance, or the same
	// host and port. Default: DefaultServerMaxConns.
	ServerMaxConns int
	// ConnectTimeout bounds a connection's dial and log-in, unless the
	// database's URL sets connect_timeout. Default: DefaultConnectTimeout.
	ConnectTimeout time.Duration
}

// DefaultConnectTimeout is the default bound on a connection's dial and
// log-in: long enough for a Cloud SQL connector's first certificate, short
// enough that a silent server is given up within seconds.
const DefaultConnectTimeout = 10 * time.Second

// DefaultServerMaxConns is the default bound on a process's connections to
// one PostgreSQL server: a drain or verifier instance stays a handful of
// sessions on the SDK's instance however many workspaces it serves.
const DefaultServerMaxConns = 8

func (c Config) withDefaults() Config {
	c.ApplicationName = cmp.Or(c.ApplicationName, "ontology-replication")
	c.MaxConns = cmp.Or(c.MaxConns, 2)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, 5*time.Minute)
	c.ConnIdleTimeout = cmp.Or(c.ConnIdleTimeout, 30*time.Second)
	c.ServerMaxConns = cmp.Or(c.ServerMaxConns, DefaultServerMaxConns)
	c.ConnectTimeout = cmp.Or(c.ConnectTimeout, DefaultConnectTimeout)
	return c
}

// Validate reports the first invalid field (a zero field takes its
// default).
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.MaxConns < 1 || c.MaxConns > 32:
		return fmt.Errorf("MaxConns %d: must be between 1 and 32", c.MaxConns)
	case c.MaxOpen < 0:
		return fmt.Errorf("MaxOpen %d: must not be negative", c.MaxOpen)
	case c.ConnIdleTimeout < time.Second:
		return fmt.Errorf("ConnIdleTimeout %v: must be at least 1s", c.ConnIdleTimeout)
	case c.ServerMaxConns < 1 || c.ServerMaxConns > 10_000:
		return fmt.Errorf("ServerMaxConns %d: must be between 1 and 10000", c.ServerMaxConns)
	case c.ConnectTimeout < time.Second:
		return fmt.Errorf("ConnectTimeout %v: must be at least 1s", c.ConnectTimeout)
	}
	return nil
}
