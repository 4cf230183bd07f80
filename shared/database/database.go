package database

// This file holds the pools' one concern, their lifetime: open on first
// use, lease, bound, close when idle; the per-server budget is server.go.
// Its length is the lifecycle's cases, each with the invariant it keeps.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"cloud.google.com/go/cloudsqlconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/segmentstream/ontology-replication/shared/registry"
)

// Pools keeps one small pgx pool per workspace database, opened on first
// use, shared by every caller of the same process while in use, and closed
// when it has been idle for IdleTimeout (or when MaxOpen pools are open and
// another is needed). It is safe for concurrent use.
type Pools struct {
	cfg Config

	mu      sync.Mutex
	pools   map[string]*entry  // by workspace id
	servers map[string]*server // by server key
	// hosts caches what database hosts resolve to (see serverKey).
	hosts   hostCache
	changed chan struct{} // closed and replaced when a lease ends
	dialer  *cloudsqlconn.Dialer
	closed  bool
	stop    chan struct{}
	done    chan struct{}
	// idleRecheck is how often a dial waiting for a place on its server
	// looks again for an idle connection to close (defaultIdleRecheck).
	idleRecheck time.Duration
}

type entry struct {
	pool     *pgxpool.Pool
	server   *server
	leases   int
	lastUsed time.Time
	closing  bool // being closed: it still counts as open
}

// server is one PostgreSQL server's connection budget in this process.
type server struct {
	key     string
	open    int   // connections dialled and not yet closed (guarded by Pools.mu)
	opened  int64 // connections dialled since the process started (guarded by Pools.mu)
	waiting int   // dials waiting for a place (guarded by Pools.mu)
	// closed is closed and replaced when one of its connections closes.
	closed chan struct{}
}

// New returns an empty set of pools.
func New(cfg Config) (*Pools, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("database: invalid config: %w", err)
	}
	cfg = cfg.withDefaults()
	p := &Pools{cfg: cfg, pools: map[string]*entry{}, servers: map[string]*server{}, changed: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{}),
		idleRecheck: defaultIdleRecheck}
	go p.closeIdle()
	return p, nil
}

// Lease is a workspace pool in use; Release ends the use.
type Lease struct {
	// Pool is the workspace's pool.
	Pool *pgxpool.Pool
	once sync.Once
	p    *Pools
	id   string
	e    *entry
}

// Release ends the lease. It is safe to call more than once.
func (l *Lease) Release() {
	l.once.Do(func() { l.p.release(l.id, l.e) })
}

// ErrClosed is returned by Acquire after Close.
var ErrClosed = errors.New("database: the pools are closed")

// Acquire returns a lease of the workspace's pool, opening the pool on
// first use. Opening a pool does not connect; a Cloud SQL dialer is created
// with the first Cloud SQL workspace (a failure is returned and retried on
// the next call, never remembered). With MaxOpen pools open and held, it
// waits until one is released or ctx ends.
func (p *Pools) Acquire(ctx context.Context, ws registry.Workspace) (*Lease, error) {
	p.resolveHosts(ctx, ws)
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrClosed
		}
		if e, ok := p.pools[ws.ID]; ok && !e.closing {
			e.leases++
			e.lastUsed = time.Now()
			p.mu.Unlock()
			return &Lease{Pool: e.pool, p: p, id: ws.ID, e: e}, nil
		}
		_, closing := p.pools[ws.ID]
		if !closing && (p.cfg.MaxOpen == 0 || len(p.pools) < p.cfg.MaxOpen) {
			e, err := p.openLocked(ctx, ws)
			p.mu.Unlock()
			if err != nil {
				return nil, err
			}
			return &Lease{Pool: e.pool, p: p, id: ws.ID, e: e}, nil
		}
		if id, e := p.leastRecentlyUsedLocked(); !closing && e != nil {
			// Close it, and only then count its slot free: the bound on
			// open pools holds for their connections too.
			e.closing = true
			p.mu.Unlock()
			p.finishClose(id, e)
			continue
		}
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("database: workspace %s: waiting for one of %d open pools: %w", ws.ID, p.cfg.MaxOpen, context.Cause(ctx))
		}
	}
}

// TryAcquireAll returns a lease of every workspace's pool, or none: without
// waiting, when the pools are open or MaxOpen leaves (or an idle pool can
// make) room for those that are not. A caller that holds all its pools
// never waits for a slot, so callers that take theirs this way cannot wait
// on one another; one that got none takes its pools one at a time with
// Acquire.
func (p *Pools) TryAcquireAll(ctx context.Context, wss []registry.Workspace) []*Lease {
	p.resolveHosts(ctx, wss...)
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil
		}
		needed := 0
		mine := map[string]bool{}
		for _, ws := range wss {
			mine[ws.ID] = true
			if e, ok := p.pools[ws.ID]; !ok || e.closing {
				needed++
			}
		}
		free := len(wss) // MaxOpen 0: no bound
		if p.cfg.MaxOpen > 0 {
			free = p.cfg.MaxOpen - len(p.pools)
		}
		if needed > free {
			// Make room from idle pools of other workspaces, if enough are
			// idle; otherwise take nothing.
			var idle []string
			for id, e := range p.pools {
				if e.leases == 0 && !e.closing && !mine[id] {
					idle = append(idle, id)
				}
			}
			if needed > free+len(idle) {
				p.mu.Unlock()
				return nil
			}
			evict := map[string]*entry{}
			for _, id := range idle[:needed-free] {
				p.pools[id].closing = true
				evict[id] = p.pools[id]
			}
			p.mu.Unlock()
			for id, e := range evict {
				p.finishClose(id, e)
			}
			continue
		}
		leases := make([]*Lease, 0, len(wss))
		for _, ws := range wss {
			e, ok := p.pools[ws.ID]
			if ok && !e.closing {
				e.leases++
				e.lastUsed = time.Now()
			} else if _, closing := p.pools[ws.ID]; closing {
				// Its old pool is still closing: wait for no one, take none.
				p.mu.Unlock()
				for _, l := range leases {
					l.Release()
				}
				return nil
			} else {
				var err error
				if e, err = p.openLocked(ctx, ws); err != nil {
					p.mu.Unlock()
					for _, l := range leases {
						l.Release()
					}
					return nil // Acquire, one at a time, reports the error
				}
			}
			leases = append(leases, &Lease{Pool: e.pool, p: p, id: ws.ID, e: e})
		}
		p.mu.Unlock()
		return leases
	}
}

// leastRecentlyUsedLocked returns the least recently used pool nobody
// holds, if any.
func (p *Pools) leastRecentlyUsedLocked() (string, *entry) {
	var oldest string
	var found *entry
	for id, e := range p.pools {
		if e.leases == 0 && !e.closing && (found == nil || e.lastUsed.Before(found.lastUsed)) {
			oldest, found = id, e
		}
	}
	return oldest, found
}

// finishClose closes a pool marked closing (nobody holds a lease, so no
// connection is out and Close returns once they are closed), then frees
// its slot.
func (p *Pools) finishClose(id string, e *entry) {
	e.pool.Close()
	p.mu.Lock()
	if p.pools[id] == e {
		delete(p.pools, id)
	}
	p.signalLocked()
	p.mu.Unlock()
}

// signalLocked wakes the callers waiting for a slot.
func (p *Pools) signalLocked() {
	if !p.closed {
		close(p.changed)
		p.changed = make(chan struct{})
	}
}

func (p *Pools) release(id string, e *entry) {
	p.mu.Lock()
	e.leases--
	e.lastUsed = time.Now()
	if e.leases == 0 && p.cfg.IdleTimeout < 0 && p.pools[id] == e && !e.closing {
		e.closing = true
		p.mu.Unlock()
		p.finishClose(id, e)
		return
	}
	p.signalLocked()
	p.mu.Unlock()
}

// closeIdle closes pools idle for IdleTimeout, until Close.
func (p *Pools) closeIdle() {
	defer close(p.done)
	if p.cfg.IdleTimeout < 0 {
		<-p.stop
		return
	}
	tick := time.NewTicker(max(p.cfg.IdleTimeout/4, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case now := <-tick.C:
			idle := map[string]*entry{}
			p.mu.Lock()
			for id, e := range p.pools {
				if e.leases == 0 && !e.closing && now.Sub(e.lastUsed) >= p.cfg.IdleTimeout {
					e.closing = true
					idle[id] = e
				}
			}
			p.mu.Unlock()
			for id, e := range idle {
				p.finishClose(id, e)
			}
		}
	}
}

func (p *Pools) openLocked(ctx context.Context, ws registry.Workspace) (*entry, error) {
	cfg, err := p.poolConfig(ctx, ws.Database)
	if err != nil {
		return nil, fmt.Errorf("database: workspace %s (%s): %w", ws.ID, ws.Database.Redacted(), err)
	}
	srv := p.serverLocked(p.serverKey(ws.Database, cfg))
	p.budget(cfg, srv, ws.Database.Pooled)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: workspace %s (%s): %w", ws.ID, ws.Database.Redacted(), err)
	}
	e := &entry{pool: pool, server: srv, leases: 1, lastUsed: time.Now()}
	p.pools[ws.ID] = e
	return e, nil
}

// ServerStats is what one process holds of one PostgreSQL server.
type ServerStats struct {
	// Server is the budget's key: the Cloud SQL instance, or the address
	// and port (see Config.ServerMaxConns).
	Server string
	// Open is the connections open now, Acquired those callers hold, and
	// Opened every connection the process dialled to the server since it
	// started: its rate is the churn the server pays (a session each).
	Open, Acquired int
	Opened         int64
}

// Stats reports the process's connections by server, in key order.
func (p *Pools) Stats() []ServerStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	byKey := make(map[string]*ServerStats, len(p.servers))
	var out []ServerStats
	for _, key := range slices.Sorted(maps.Keys(p.servers)) {
		srv := p.servers[key]
		out = append(out, ServerStats{Server: key, Open: srv.open, Opened: srv.opened})
	}
	for i := range out {
		byKey[out[i].Server] = &out[i]
	}
	for _, e := range p.pools {
		if st := byKey[e.server.key]; st != nil {
			st.Acquired += int(e.pool.Stat().AcquiredConns())
		}
	}
	return out
}

// Close closes every pool (waiting for their connections to come back)
// and the Cloud SQL dialer.
func (p *Pools) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	pools := p.pools
	p.pools = map[string]*entry{}
	close(p.changed)
	p.mu.Unlock()
	close(p.stop)
	<-p.done
	for _, e := range pools {
		e.pool.Close()
	}
	if p.dialer != nil {
		_ = p.dialer.Close()
	}
}
