package database

import (
	"cmp"
	"context"
	"fmt"
	"net"
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
	cfg.MaxConnLifetime = 30 * time.Minute
	cfg.HealthCheckPeriod = min(p.cfg.ConnIdleTimeout, time.Minute)
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	if p.cfg.Tracer != nil {
		cfg.ConnConfig.Tracer = p.cfg.Tracer
	}
	if p.cfg.OnConnect != nil {
		cfg.AfterConnect = func(context.Context, *pgx.Conn) error { p.cfg.OnConnect(); return nil }
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
	for name, value := range map[string]string{"statement_timeout": "30s", "lock_timeout": "5s", "client_connection_check_interval": "1s"} {
		if _, ok := cfg.ConnConfig.RuntimeParams[name]; !ok {
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
