package store

import (
	"context"
	"fmt"
	"time"
)

// SessionCounts are the sessions the server has opened
// (pg_stat_database.sessions, PostgreSQL 14 and later): in the workspace's
// database, and in all the databases of its server, since the statistics
// were last reset (Since; zero when the server does not say), as read at
// ReadAt. Their rate is the connection churn an operator watches: a
// drain that opens a session per commit costs the server a process, a
// login and cold caches each time (README, Connections to the SDK's
// database).
type SessionCounts struct {
	Database, Server int64
	Since, ReadAt    time.Time
}

// sqlSessionCounts reads SessionCounts; the view is readable by every role.
const sqlSessionCounts = `SELECT coalesce(d.sessions, 0), coalesce((SELECT sum(sessions) FROM pg_stat_database), 0)::bigint,
       d.stats_reset, clock_timestamp()
  FROM pg_stat_database d WHERE d.datname = current_database()`

// SessionCounts reads the server's counts of the sessions it opened.
func (s *Store) SessionCounts(ctx context.Context) (SessionCounts, error) {
	var c SessionCounts
	var since *time.Time
	if err := s.db.QueryRow(ctx, sqlSessionCounts).Scan(&c.Database, &c.Server, &since, &c.ReadAt); err != nil {
		return c, fmt.Errorf("store: read the server's session counts: %w", err)
	}
	if since != nil {
		c.Since = *since
	}
	return c, nil
}

// PerMinute is the rate of sessions opened between two reads (the
// database's and the server's), or since the statistics' reset when prev
// is the zero value and the reset time is known; ok is false when
// neither gives a span.
func (c SessionCounts) PerMinute(prev SessionCounts) (database, server float64, ok bool) {
	from, db0, srv0 := prev.ReadAt, prev.Database, prev.Server
	if from.IsZero() {
		from, db0, srv0 = c.Since, 0, 0
	}
	span := c.ReadAt.Sub(from).Minutes()
	if from.IsZero() || span <= 0 || c.Database < db0 || c.Server < srv0 {
		return 0, 0, false
	}
	return float64(c.Database-db0) / span, float64(c.Server-srv0) / span, true
}
