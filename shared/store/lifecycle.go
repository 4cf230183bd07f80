package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The SDK's lifecycle lock, seen from outside. Advisory locks need no
// privilege: any role that can connect to the database — this project's
// drain, verifier and job roles included — can take the lifecycle lock
// exclusively and so stall every SDK write, which takes it shared first.
// No GRANT prevents that; what an operator can do is see it. LifecycleHold
// reads, from pg_locks (which every role may read), the sessions that hold
// the lock exclusively and how long the oldest of those waiting for it
// has waited (PostgreSQL 14's waitstart).

// LifecycleHold is an exclusive hold of the lifecycle lock.
type LifecycleHold struct {
	// Holders are the backends holding it exclusively, with their
	// application_name.
	Holders []LifecycleHolder `json:"holders"`
	// Waiting counts the sessions waiting for the lock (SDK writers among
	// them), and LongestWait is how long the first of them has waited.
	Waiting     int           `json:"waiting"`
	LongestWait time.Duration `json:"-"`
}

// LifecycleHolder is one backend that holds the lifecycle lock exclusively.
type LifecycleHolder struct {
	PID         int32  `json:"pid"`
	Application string `json:"application"`
}

// sqlLifecycleHold reads the exclusive holders of the lifecycle lock ($1:
// LifecycleLock) in this database and its waiters.
const sqlLifecycleHold = `WITH lock AS (
    SELECT l.pid, l.mode, l.granted, l.waitstart FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.objsubid = 1
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND l.classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid
       AND l.objid = (hashtextextended($1, 0) & 4294967295)::oid
  )
  SELECT coalesce(array_agg(h.pid) FILTER (WHERE h.granted AND h.mode = 'ExclusiveLock'), '{}'),
         coalesce(array_agg(coalesce(a.application_name, '')) FILTER (WHERE h.granted AND h.mode = 'ExclusiveLock'), '{}'),
         count(*) FILTER (WHERE NOT h.granted),
         coalesce(extract(epoch FROM clock_timestamp() - min(h.waitstart) FILTER (WHERE NOT h.granted)), 0)::float8
    FROM lock h LEFT JOIN pg_stat_activity a ON a.pid = h.pid`

// LifecycleHold reports who holds the SDK's lifecycle lock exclusively
// (nil when nobody does).
func (s *Store) LifecycleHold(ctx context.Context) (*LifecycleHold, error) {
	var pids []int32
	var apps []string
	var waiting int
	var waited float64
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, sqlLifecycleHold, LifecycleLock).Scan(&pids, &apps, &waiting, &waited)
	})
	if err != nil {
		return nil, fmt.Errorf("store: read the lifecycle lock's holders: %w", err)
	}
	if len(pids) == 0 {
		return nil, nil
	}
	h := &LifecycleHold{Waiting: waiting, LongestWait: time.Duration(waited * float64(time.Second))}
	for i, pid := range pids {
		h.Holders = append(h.Holders, LifecycleHolder{PID: pid, Application: apps[i]})
	}
	return h, nil
}
