package pgtest

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Restart restarts a throwaway cluster's server as `pg_ctl restart -m fast`
// does: every session is ended (each client sees its connection fail),
// and a new server starts on the same port with the same data. The chaos
// run's whole-server restart; a $DATABASE_URL cluster cannot be
// restarted. It returns how many client sessions the server had.
func (c *Cluster) Restart(ctx context.Context) (int, error) {
	if c.restart == nil {
		return 0, errors.New("pgtest: only a throwaway cluster can be restarted")
	}
	var sessions int
	if conn, err := pgx.Connect(ctx, c.admin.String()); err == nil {
		_ = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&sessions)
		_ = conn.Close(ctx)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopServerLocked()
	next, err := c.restart(ctx)
	if err != nil {
		return sessions, err
	}
	c.process, c.exited = next.process, next.exited
	c.restarts++
	return sessions, nil
}

// Restarts is how many times Restart started the server again.
func (c *Cluster) Restarts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.restarts
}

// stopServerLocked stops the owned server as `pg_ctl stop -m fast` does
// (SIGINT: every session ended), SIGQUIT if it is still up 15 s later, and
// waits for it to exit. c.mu is held.
func (c *Cluster) stopServerLocked() {
	_ = c.process.Process.Signal(syscall.SIGINT) // fast shutdown
	select {
	case <-c.exited:
	case <-time.After(15 * time.Second):
		_ = c.process.Process.Signal(syscall.SIGQUIT)
		<-c.exited
	}
}
