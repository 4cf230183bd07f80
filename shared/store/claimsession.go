package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A claim's session: the first statement of its round trip, which sets the
// claim's timeouts and takes the lifecycle lock (and, on a session that
// holds the next turn, takes the turn and lets the next turn go), and the
// unlock that ends it.

// turnHold is what of the drain's turns (see turn.go) a session's claim
// holds: the next turn, which the claim's first statement lets go before
// its candidates are read, and the turn, or else (take) the claim's first
// statement takes the turn first, waiting at most bound.
type turnHold struct {
	turn, next, take bool
	bound            time.Duration
}

// sqlClaimSession reads the session's idle_session_timeout (which the
// candidates' statement sets while the claim holds locks, and the claim's
// release puts back), sets the timeouts of a claim's read (local to its
// implicit transaction) and takes the shared
// lifecycle lock for the read only: a read of several tables in one
// transaction then never holds one table's lock while a migration, which
// takes the lifecycle lock exclusively first, holds another's. The read
// commits within milliseconds, before anything is published.
//
// It also has the statements after it in its transaction run with their
// generic plans (plan_cache_mode, local too). Their custom plans are the
// same plans, but PostgreSQL's plan cache may keep choosing them, and the
// candidates' statement then costs about 0.35 ms of planning at every
// claim, three times what it costs to run (in BenchmarkWakeUps, up to 28 %
// of the drain's database CPU was planning). TestClaimUsesGenericPlans
// holds it, and TestClaimGenericPlanReadsByIndex checks the generic plan.
const sqlClaimSession = `SELECT current_setting('idle_session_timeout'), set_config('statement_timeout', $1, true),
  set_config('lock_timeout', $2, true), set_config('plan_cache_mode', 'force_generic_plan', true),
  pg_advisory_xact_lock_shared(hashtextextended($3, 0))`

// sqlClaimSessionLeavingNext is sqlClaimSession of a drain that holds the
// next turn (see turn.go), which it lets go ($4: DrainTurnClass) in this
// statement, before the candidates' statement takes its snapshot.
const sqlClaimSessionLeavingNext = sqlClaimSession + `, pg_advisory_unlock(hashtext($4), 2)`

// sqlClaimSessionTakingTurn is sqlClaimSessionLeavingNext of a drain that
// holds the next turn and not the turn: a FROM item takes the turn first,
// waiting at most $5 (see waitBound), before the target list sets the
// claim's own timeouts, takes the lifecycle lock and lets the next turn go;
// it also says how long it waited (microseconds). So the drain holds the
// turn before another can take the next turn. A drain that gathered
// commits while it held the next turn nearly always finds the turn free by
// then: the wait it would have spent in the server before its gathering,
// a sleep and a wake-up of its backend, is saved.
var sqlClaimSessionTakingTurn = sqlClaimSessionLeavingNext + `, turn.waited
  FROM (SELECT (extract(epoch FROM clock_timestamp() - l.at) * 1000000)::bigint AS waited
          FROM (SELECT bound.at, pg_advisory_lock(hashtext($4), 1) FROM ` + waitBound("$5") + ` OFFSET 0) l OFFSET 0) turn`

// readClaimSession reads the result of the claim's first statement
// (sqlClaimSession, or as hold says sqlClaimSessionLeavingNext or
// sqlClaimSessionTakingTurn): the session's idle_session_timeout before
// the claim, which its release puts back, and how long it waited for the
// turn.
func readClaimSession(results pgx.BatchResults, hold turnHold) (string, time.Duration, error) {
	var prior string
	var waited int64
	dest := []any{&prior, nil, nil, nil, nil}
	if hold.next {
		dest = append(dest, nil)
	}
	if hold.take {
		dest = append(dest, &waited)
	}
	err := results.QueryRow().Scan(dest...)
	return prior, time.Duration(waited) * time.Microsecond, err
}

// sqlUnlockRestore releases every claim lock of the session and puts its
// idle_session_timeout, which a claim that took a lock sets (see
// sqlCandidates), back to what it was before the claim ($1, read by
// sqlClaimSession): the setting lasts as long as the claim, never into the
// connection's next use. sqlUnlockClaims does the same where that value is
// not known (two statements, for the simple protocol: Exec without
// arguments), putting the session's default back; sqlUnlockAll releases
// the locks only (a turn that claimed nothing set nothing).
const (
	sqlUnlockRestore = `SELECT pg_advisory_unlock_all(), set_config('idle_session_timeout', $1, false)`
	sqlUnlockClaims  = sqlUnlockAll + "; " + sqlResetIdle
	sqlUnlockAll     = `SELECT pg_advisory_unlock_all()`
	sqlResetIdle     = `RESET idle_session_timeout`
)

// unlock releases every lock of conn's session and restores its
// idle_session_timeout (to prior when known).
func unlock(ctx context.Context, conn *pgxpool.Conn, prior *string) error {
	if prior != nil {
		_, err := conn.Exec(ctx, sqlUnlockRestore, *prior)
		return err
	}
	_, err := conn.Exec(ctx, sqlUnlockClaims)
	return err
}
