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

// TurnHolder is a session that holds a drain's turn or next turn (see
// Turns in the package doc), and for how long it has at least held it.
type TurnHolder struct {
	PID         int32
	Application string
	// Role is "turn" (it claims, publishes and acknowledges) or "next"
	// (it gathers, or waits for the turn in its claim).
	Role string
	// State is the session's state (idle: a batch out, or a gathering;
	// active: a statement running), empty when this role may not see it
	// (another role's session, without pg_read_all_stats).
	State string
	// Waiting counts the drains waiting for this lock, and LongestWait is
	// how long the first of them has waited (pg_locks, which every role
	// may read).
	Waiting     int
	LongestWait time.Duration
	// Held is the least time it has held the lock: the longer of its
	// session's time in its state (where visible) and LongestWait.
	Held time.Duration
}

// sqlTurnHolders reads the holders of the drain's turns ($1:
// DrainTurnClass) in this database, each with its session's state and how
// long it has been in it (NULL where this role may not see them), and the
// drains waiting for its lock.
const sqlTurnHolders = `WITH turn AS (
    SELECT l.pid, l.objid::bigint AS key, l.granted, l.waitstart FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.classid::int = hashtext($1)
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  )
  SELECT h.pid, coalesce(a.application_name, ''), CASE h.key WHEN 1 THEN 'turn' ELSE 'next' END, coalesce(a.state, ''),
         coalesce(extract(epoch FROM clock_timestamp() - a.state_change), 0)::float8,
         (SELECT count(*) FROM turn w WHERE w.key = h.key AND NOT w.granted),
         coalesce((SELECT extract(epoch FROM clock_timestamp() - min(w.waitstart)) FROM turn w WHERE w.key = h.key AND NOT w.granted), 0)::float8
    FROM turn h LEFT JOIN pg_stat_activity a ON a.pid = h.pid
   WHERE h.granted ORDER BY h.key, h.pid`

// TurnHolders reads who holds the workspace's drain turn and next turn. A
// holder is normally in its state for a gathering, a claim's statements or
// a protocol-3 batch's publish (well under a second to a few); one that
// stays longer is slow, or frozen (the server ends it after
// Config.IdleTimeout idle).
func (s *Store) TurnHolders(ctx context.Context) ([]TurnHolder, error) {
	var out []TurnHolder
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlTurnHolders, DrainTurnClass)
		if err != nil {
			return err
		}
		var h TurnHolder
		var inState, waited float64
		_, err = pgx.ForEachRow(rows, []any{&h.PID, &h.Application, &h.Role, &h.State, &inState, &h.Waiting, &waited}, func() error {
			h.LongestWait = time.Duration(waited * float64(time.Second))
			h.Held = max(time.Duration(inState*float64(time.Second)), h.LongestWait)
			out = append(out, h)
			return nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: read the drain turns' holders: %w", err)
	}
	return out, nil
}
