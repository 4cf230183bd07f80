package database

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	"cloud.google.com/go/cloudsqlconn"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/segmentstream/ontology-replication/shared/registry"
)

// poolConfig builds a workspace pool's settings: its URL, or a Cloud SQL
// instance dialled through cloudsqlconn, with the pool size, the session
// defaults and the per-server budget's hooks.
func (p *Pools) poolConfig(ctx context.Context, db registry.Database) (*pgxpool.Config, error) {
	dsn := db.URL
	if db.Instance != "" {
		// No TLS on the wire pgx sees: cloudsqlconn's tunnel is TLS. No
		// password: it logs in with the IAM identity.
		dsn = "sslmode=disable"
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse connection settings: %w", err)
	}
	if db.Instance != "" {
		cfg.ConnConfig.User, cfg.ConnConfig.Database = db.User, db.Name
	}
	cfg.MaxConns = cmp.Or(db.MaxConns, p.cfg.MaxConns)
	cfg.MinConns = 0
	cfg.MaxConnIdleTime = p.cfg.ConnIdleTimeout
	if db.Pooled {
		// Released connections are closed (see budget); one a pool keeps
		// otherwise (dialled for a caller that gave up) goes back to the
		// pooler soon.
		cfg.MaxConnIdleTime = PooledIdleTimeout
	}
	cfg.MaxConnLifetime = 30 * time.Minute
	cfg.HealthCheckPeriod = min(cfg.MaxConnIdleTime, time.Minute)
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = p.cfg.ConnectTimeout
	}
	if p.cfg.Tracer != nil {
		cfg.ConnConfig.Tracer = p.cfg.Tracer
	}
	onConnect := p.cfg.OnConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if onConnect != nil {
			onConnect()
		}
		if !db.Pooled {
			return nil
		}
		// A pooler refuses these as startup parameters; set on the
		// session, they last until the pooler's reset (DISCARD ALL) when
		// this client leaves.
		if _, err := conn.Exec(ctx, sqlSessionDefaults); err != nil {
			return fmt.Errorf("set the session's timeouts through the pooler: %w", err)
		}
		return nil
	}
	if p.cfg.OnClose != nil {
		cfg.BeforeClose = func(*pgx.Conn) { p.cfg.OnClose() }
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = p.cfg.ApplicationName
	}
	// Session defaults that bound every statement, including those the
	// store's transactions cannot bound themselves (pgx prepares a
	// pipeline's statements before it runs the first, SET LOCAL included);
	// the store still sets both locally in every transaction. And
	// client_connection_check_interval: a statement waiting in the server
	// (a drain queued for its turn, which holds the next turn while it
	// waits) notices within a second that its client has gone (a process
	// killed) and ends, where it would otherwise keep its locks until its
	// wait's own bound; PostgreSQL 14 and later, on Linux (Cloud SQL).
	for name, value := range sessionDefaults {
		if _, ok := cfg.ConnConfig.RuntimeParams[name]; !ok && !db.Pooled {
			cfg.ConnConfig.RuntimeParams[name] = value
		}
	}
	if db.Instance == "" {
		return cfg, nil
	}
	if p.dialer == nil {
		// The connector's own metrics stay on, deliberately: they show the
		// connections from the database's side (dial latency, refresh
		// errors), and terraform grants the monitoring.metricWriter role
		// they need in the instance's project.
		opts := append([]cloudsqlconn.Option{cloudsqlconn.WithIAMAuthN(), cloudsqlconn.WithLazyRefresh(), cloudsqlconn.WithBuiltInMetrics(true)},
			p.cfg.DialerOptions...)
		d, err := cloudsqlconn.NewDialer(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("create Cloud SQL dialer: %w", err)
		}
		p.dialer = d
	}
	var dialOpts []cloudsqlconn.DialOption
	if db.PrivateIP {
		dialOpts = append(dialOpts, cloudsqlconn.WithPrivateIP())
	}
	dialer, instance, user := p.dialer, db.Instance, db.User
	cfg.ConnConfig.DialFunc = func(ctx context.Context, _, _ string) (net.Conn, error) {
		conn, err := dialer.Dial(ctx, instance, dialOpts...)
		if err != nil {
			return nil, explainCloudSQL(err, instance, user)
		}
		return conn, nil
	}
	return cfg, nil
}

// sessionDefaults are the session settings every connection starts with
// (see poolConfig).
var sessionDefaults = map[string]string{"statement_timeout": "30s", "lock_timeout": "5s", "client_connection_check_interval": "1s"}

// sqlSessionDefaults sets sessionDefaults on a pooled connection, in one
// simple-protocol round trip (the values are the constants above).
var sqlSessionDefaults = func() string {
	var sets []string
	for _, name := range slices.Sorted(maps.Keys(sessionDefaults)) {
		sets = append(sets, fmt.Sprintf("SET %s = '%s'", name, sessionDefaults[name]))
	}
	return strings.Join(sets, "; ")
}()

// PooledIdleTimeout is how long a connection through a pooler
// (registry.Database.Pooled) stays idle in its pool before it is closed
// and its server connection goes back to the pooler.
const PooledIdleTimeout = time.Second
