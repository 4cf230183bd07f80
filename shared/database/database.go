package database

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"cloud.google.com/go/cloudsqlconn"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/segmentstream/ontology-replication/shared/registry"
)

// Config configures Pools.
type Config struct {
	// ApplicationName is reported to PostgreSQL (pg_stat_activity), so the
	// SDK's owners can tell this project's connections from theirs.
	// Default: "ontology-replication".
	ApplicationName string
	// DialerOptions are extra cloudsqlconn options (tests). IAM login and
	// lazy refresh are always on.
	DialerOptions []cloudsqlconn.Option
	// Tracer, when set, traces every query of every pool (benchmarks count
	// round trips with it).
	Tracer pgx.QueryTracer
}

// Pools keeps one small pgx pool per workspace database, created on first
// use and reused by every later invocation of the same instance.
type Pools struct {
	cfg Config

	mu     sync.Mutex
	pools  map[string]*pgxpool.Pool
	dialer *cloudsqlconn.Dialer
}

// New returns an empty set of pools.
func New(cfg Config) *Pools {
	cfg.ApplicationName = cmp.Or(cfg.ApplicationName, "ontology-replication")
	return &Pools{cfg: cfg, pools: map[string]*pgxpool.Pool{}}
}

// Pool returns the workspace's pool, creating it on first use. Creating a
// pool does not connect; a Cloud SQL dialer is created with the first Cloud
// SQL workspace (a failure is returned and retried on the next call, never
// remembered).
func (p *Pools) Pool(ctx context.Context, ws registry.Workspace) (*pgxpool.Pool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pool, ok := p.pools[ws.ID]; ok {
		return pool, nil
	}
	cfg, err := p.poolConfig(ctx, ws.Database)
	if err != nil {
		return nil, fmt.Errorf("database: workspace %s (%s): %w", ws.ID, ws.Database.Redacted(), err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: workspace %s (%s): %w", ws.ID, ws.Database.Redacted(), err)
	}
	p.pools[ws.ID] = pool
	return pool, nil
}

func (p *Pools) poolConfig(ctx context.Context, db registry.Database) (*pgxpool.Config, error) {
	dsn := db.URL
	if db.Instance != "" {
		// No password: cloudsqlconn logs in with the IAM identity.
		dsn = fmt.Sprintf("user=%s dbname=%s sslmode=disable", quoteDSN(db.User), quoteDSN(db.Name))
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse connection settings: %w", err)
	}
	cfg.MaxConns = cmp.Or(db.MaxConns, registry.DefaultMaxConns)
	cfg.MinConns = 0
	cfg.MaxConnIdleTime = 5 * time.Minute
	cfg.MaxConnLifetime = 30 * time.Minute
	cfg.HealthCheckPeriod = time.Minute
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	if p.cfg.Tracer != nil {
		cfg.ConnConfig.Tracer = p.cfg.Tracer
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = p.cfg.ApplicationName
	}
	if db.Instance == "" {
		return cfg, nil
	}
	if p.dialer == nil {
		opts := append([]cloudsqlconn.Option{cloudsqlconn.WithIAMAuthN(), cloudsqlconn.WithLazyRefresh()}, p.cfg.DialerOptions...)
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
	dialer, instance := p.dialer, db.Instance
	cfg.ConnConfig.DialFunc = func(ctx context.Context, _, _ string) (net.Conn, error) {
		return dialer.Dial(ctx, instance, dialOpts...)
	}
	return cfg, nil
}

// quoteDSN quotes a keyword/value connection string value.
func quoteDSN(v string) string {
	out := []byte{'\''}
	for i := 0; i < len(v); i++ {
		if v[i] == '\'' || v[i] == '\\' {
			out = append(out, '\\')
		}
		out = append(out, v[i])
	}
	return string(append(out, '\''))
}

// Close closes every pool and the Cloud SQL dialer.
func (p *Pools) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, pool := range p.pools {
		pool.Close()
		delete(p.pools, id)
	}
	if p.dialer != nil {
		_ = p.dialer.Close()
		p.dialer = nil
	}
}
