package store

import (
	"context"
	"fmt"
	"time"
)

// keepAlive touches a claim's own session (sqlTouch) every
// Config.IdleTimeout/3 while the claim is out, so that the server's idle
// timeout ends the session only when the claim's process has stopped,
// never while a slow publish (a bisection, a Pub/Sub that answers late) is
// out. The claim's owner does not use the connection between the claim and
// its end: Finish, Release and Narrow stop it first, and wait for a touch
// in progress.
type keepAlive struct {
	stop chan struct{}
	done chan struct{}
}

// keepAlive starts the claim's keepAlive, if it holds a session of its own
// with locks. It is safe on nil and on a claim that has one.
func (c *Claim) keepAlive() {
	if c == nil || c.alive != nil || c.conn == nil || c.mode == inSession || !c.locked {
		return
	}
	conn, every, timeout := c.conn, c.store.touchEvery(), c.store.cfg.StatementTimeout
	k := &keepAlive{stop: make(chan struct{}), done: make(chan struct{})}
	c.alive = k
	go func() {
		defer close(k.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-k.stop:
				return
			case <-tick.C:
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				_, _ = conn.Exec(ctx, sqlTouch) // a broken session fails the claim's own end
				cancel()
			}
		}
	}()
}

// stopAlive stops the claim's keepAlive, if any, and waits for it.
func (c *Claim) stopAlive() {
	if c.alive == nil {
		return
	}
	close(c.alive.stop)
	<-c.alive.done
	c.alive = nil
}

// sqlTouch is the statement that keeps a session alive (see Touch).
const sqlTouch = `SELECT 1`

// TouchAt is when the session is next due a touch (Touch): the zero time
// when it holds none of the drain's locks, whose idle timeout it would
// keep off.
func (ss *Session) TouchAt() time.Time {
	if ss.conn == nil || ss.closed || (ss.out == 0 && !ss.nextHeld && !ss.turnHeld) {
		return time.Time{}
	}
	return ss.used.Add(ss.store.touchEvery())
}

// Touch keeps the session alive while its batches are out (or it holds a
// turn), when it is due (TouchAt): one trivial statement, so that the
// server's idle timeout (Config.IdleTimeout) ends the session only when
// its process has stopped, never while a long publish is out.
func (ss *Session) Touch(ctx context.Context) error {
	at := ss.TouchAt()
	if at.IsZero() || time.Now().Before(at) {
		return nil
	}
	_, err := ss.conn.Exec(ctx, sqlTouch)
	ss.used = time.Now()
	if err != nil {
		ss.dirty = true
		return fmt.Errorf("store: keep the drain session alive: %w", err)
	}
	return nil
}

// touchEvery is how often a holder of the drain's locks touches its
// session.
func (s *Store) touchEvery() time.Duration { return s.cfg.IdleTimeout / 3 }
