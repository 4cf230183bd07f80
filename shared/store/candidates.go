package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/segmentstream/ontology-replication/shared/event"
)

// A claim's candidates: the pending delivery rows its statement reads,
// try-locks and reads the events of (see Claims in the package doc).

// claimPageSize is how many candidates one claim read considers.
const claimPageSize = event.MaxBatchEvents

// maxClaimPages bounds the candidate pages one claim reads past events that
// other drains hold.
const maxClaimPages = 16

// sqlClaimable is what the store adds to the seed's pending predicate
// (accepted_at IS NULL): a pending row that was set aside (see SetAside) is
// skipped until its backoff has passed. $3 is the set of backoffs the store
// writes, in microseconds; the seed's retry moves next_verify_at exactly
// 30 s past last_checked_at, which is not one of them.
var sqlClaimable = `NOT (next_verify_at > now() AND ` + setAsideMarked("$3") + `)`

// maxReadTables bounds the history tables whose events a claim's statement
// reads itself (see readTables); the baselines come on top.
const maxReadTables = 4

// sqlCandidates is the read of pendingReplicationEvents at protocol 4 (seed
// 000): the oldest outstanding references in revision order, from the
// partial index _ontology_delivery_pending, so that the read does not grow
// with retained history, each try-locked for the claim, the claimed ones
// found again by version and, when another transaction touched them, locked
// by primary key FOR NO KEY UPDATE SKIP LOCKED for the statement with the
// pending predicate, written so that no partial index matches it (see
// above, and Finding rows by key), each with
// whether it was claimed, its lock's key, whether it is still pending, and
// its row's last set-aside backoff (next_verify_at −
// last_checked_at, in microseconds). The claims are put in order by the uuid
// (candidates.event_id), not by the text the query returns under the same
// name, which would sort by the database's collation (strcoll under
// en_US.UTF-8, Cloud SQL's default). Each claimed row comes with its event
// when it is a baseline or its history table is one of the read tables
// ($4, bare names, in the order of the %[2]s branches: the seed's
// per-table reads, sqlBaselineEvents and sqlHistoryEvents, one primary-key
// lookup a row), and then, for an event that is NULL, whether its row
// exists (its replication column is NULL) or is gone. $1 is the
// generation (NULL: the active generation, when replication is enabled);
// $2 is ClaimLockClass; $3 the store's
// backoffs; $5 the session's idle_session_timeout while it holds claims
// (Config.IdleTimeout), set with the first lock the statement takes,
// so that a claim that took none leaves its session as it was; $6 the keys
// of the claim locks the session holds already (a Session's claims out),
// whose rows the statement neither locks again (a session's try-lock of a
// lock it holds succeeds) nor counts as held by others (own); the page
// reads that many rows more than 100 (pageLimit), so that a session
// claiming from the head while its claims are out still finds a page of
// rows to claim behind theirs in one round trip. %[1]s bounds the page: nothing on the first,
// sqlCandidatesAfter on the next ones, which walk the index from the last
// candidate. %[2]s and %[3]s are the read tables' branches
// (readBranches).
var sqlCandidates = `WITH candidates AS MATERIALIZED (
    SELECT ctid AS at, generation, event_id, history_table, revision, next_verify_at, last_checked_at FROM _ontology_replication_delivery
     WHERE generation = coalesce($1::uuid, (SELECT active_generation FROM _ontology_replication WHERE id AND enabled))
       AND accepted_at IS NULL %[1]s AND ` + sqlClaimable + `
     ORDER BY revision, event_id LIMIT 100 + cardinality($6::int4[])
  ), claims AS MATERIALIZED (
    SELECT candidates.*, hashtext(event_id::text) = ANY ($6::int4[]) AS own,
           CASE WHEN hashtext(event_id::text) = ANY ($6::int4[]) THEN false
             ELSE pg_try_advisory_lock(hashtext($2), hashtext(event_id::text))
               AND set_config('idle_session_timeout', $5, false) IS NOT NULL END AS claimed,
           CASE WHEN history_table IS NULL THEN 0 ELSE array_position($4::text[], history_table) END AS source
      FROM candidates ORDER BY candidates.revision, candidates.event_id
  ), seen AS MATERIALIZED (
    SELECT ctid AS at, event_id, xmax = '0'::xid AS newest FROM _ontology_replication_delivery
     WHERE ctid = ANY (ARRAY(SELECT at FROM claims WHERE claimed))
  ), held AS MATERIALIZED (
    SELECT event_id FROM _ontology_replication_delivery
     WHERE generation = (SELECT generation FROM candidates LIMIT 1) AND event_id = ANY (ARRAY(SELECT event_id FROM seen WHERE NOT newest))
       AND (CASE WHEN accepted_at IS NULL AND ` + sqlClaimable + ` THEN true END)
       FOR NO KEY UPDATE SKIP LOCKED
  ), still AS (
    SELECT claims.*, claimed AND (event_id IN (SELECT event_id FROM seen WHERE newest) OR event_id IN (SELECT event_id FROM held)) AS pending
      FROM claims OFFSET 0
  ), events AS (
    SELECT still.*, CASE WHEN pending THEN CASE source
             WHEN 0 THEN (SELECT b.event FROM _ontology_replication_baselines b WHERE b.generation = still.generation AND b.id = still.event_id)%[2]s
           END END AS event
      FROM still OFFSET 0
  )
  SELECT event_id::text, history_table, revision, ` + sqlSetAsideInterval + `, claimed, own,
         CASE WHEN claimed THEN hashtext(event_id::text) END, pending, source IS NOT NULL, event,
         CASE WHEN pending AND event IS NULL THEN CASE source
           WHEN 0 THEN EXISTS (SELECT FROM _ontology_replication_baselines b WHERE b.generation = events.generation AND b.id = events.event_id)%[3]s
         END END
    FROM events`

const sqlCandidatesAfter = `AND (revision, event_id) > ($7::bigint, $8::uuid)`

// candidatesStatement returns sqlCandidates with the read tables' branches
// (their quoted identifiers, checked against the capture-trigger tables),
// for the first page or, with next, the following ones.
func candidatesStatement(read []string, next bool) string {
	var events, present strings.Builder
	for i, ident := range read {
		fmt.Fprintf(&events, "\n             WHEN %d THEN (SELECT h.replication FROM %s h WHERE h.id = still.event_id)", i+1, ident)
		fmt.Fprintf(&present, "\n           WHEN %d THEN EXISTS (SELECT FROM %s h WHERE h.id = events.event_id)", i+1, ident)
	}
	after := ""
	if next {
		after = sqlCandidatesAfter
	}
	return fmt.Sprintf(sqlCandidates, after, events.String(), present.String())
}

// candidate is one pending delivery row a claim read considered.
type candidate struct {
	id       string
	table    *string
	revision int64
	backoff  time.Duration // its last set-aside backoff, if any
	claimed  bool          // false: another drain holds it, or own
	own      bool          // its lock is one the session holds already (not claimed again)
	key      int32         // its claim lock's key, when claimed
	pending  bool          // claimed and still pending when the statement looked again
	read     bool          // the statement read its event: event, present
	event    []byte
	present  bool
}

// queueCandidates queues a page of candidates (sqlCandidates) of the
// generation (nil: the active one) after the given candidate (nil: from the
// start), reading the events of the read tables (see readTables), passing
// over the rows of the session's own claim locks (own); its first lock
// sets the session's idle_session_timeout to idle. It returns the page's
// limit (pageLimit).
func (s *Store) queueCandidates(b *pgx.Batch, generation any, read readTables, after *candidate, own []int32, idle time.Duration) (limit int) {
	if own == nil {
		own = []int32{}
	}
	if after == nil {
		b.Queue(candidatesStatement(read.idents, false), generation, ClaimLockClass, s.backoffs, read.names, ms(idle), own)
	} else {
		b.Queue(candidatesStatement(read.idents, true), generation, ClaimLockClass, s.backoffs, read.names, ms(idle), own, after.revision, after.id)
	}
	return pageLimit(own)
}

// pageLimit is how many rows a page of candidates passing over the own
// keys reads at most: a full page ends there.
func pageLimit(own []int32) int { return claimPageSize + len(own) }

// candidates reads and locks the next page of candidates after the given
// one (nil: from the start) on the claim's session, in one round trip that
// also sets the session's timeouts.
func (c *Claim) candidates(ctx context.Context, generation string, after *candidate) ([]candidate, error) {
	s := c.store
	conn := c.db()
	read, err := s.readTables(ctx, conn)
	if err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	b.Queue(sqlClaimSession, ms(s.cfg.StatementTimeout), ms(s.cfg.LockTimeout), LifecycleLock)
	c.limit = s.queueCandidates(b, generation, read, after, c.ownKeys(), s.cfg.IdleTimeout)
	c.locked = true
	results := conn.SendBatch(ctx, b)
	cands, err := func() ([]candidate, error) {
		prior, _, err := readClaimSession(results, turnHold{})
		if err != nil {
			return nil, err
		}
		if c.idlePrior == nil && c.mode == ownSession {
			c.idlePrior = &prior
		}
		rows, err := results.Query()
		if err != nil {
			return nil, err
		}
		return collectCandidates(rows, s.backoffs)
	}()
	if cerr := results.Close(); err == nil {
		err = cerr
	}
	if undefinedTable(err) {
		s.forgetCaptureTables() // a read table has gone: look them up again next time
	}
	return cands, err
}

// collectCandidates reads sqlCandidates: every candidate, with claimed
// ones marked (the others are held by other drains) with their lock's key,
// the backoff of those last set aside (an interval that is one of
// backoffs), and the events the statement read; in queue order.
func collectCandidates(rows pgx.Rows, backoffs []int64) ([]candidate, error) {
	cands := make([]candidate, 0, claimPageSize)
	var cd candidate
	var interval *int64
	var key *int32
	var present *bool
	var raw []byte
	_, err := pgx.ForEachRow(rows, []any{&cd.id, &cd.table, &cd.revision, &interval, &cd.claimed, &cd.own, &key, &cd.pending, &cd.read, &raw, &present}, func() error {
		cd.backoff = 0
		if interval != nil && slices.Contains(backoffs, *interval) {
			cd.backoff, _ = splitInterval(*interval)
		}
		cd.key = 0
		if key != nil {
			cd.key = *key
		}
		cd.event = nil
		if raw != nil {
			cd.event = append([]byte(nil), raw...)
		}
		cd.present = raw != nil || (present != nil && *present)
		cands = append(cands, cd)
		return nil
	})
	// In the order the claims were read: by revision, then by the uuid
	// (which sorts as its text does).
	slices.SortFunc(cands, func(a, b candidate) int {
		return cmp.Or(cmp.Compare(a.revision, b.revision), strings.Compare(a.id, b.id))
	})
	return cands, err
}

// readTables are the history tables whose events a claim's statement
// reads itself: their bare names and quoted identifiers.
type readTables struct{ names, idents []string }

// readTables returns the tables met in recent claims that still carry the
// capture trigger (the capture tables are loaded on first use); those that
// no longer do (renamed, dropped) are forgotten.
func (s *Store) readTables(ctx context.Context, q querier) (readTables, error) {
	ct, err := s.captureTables(ctx, q, false)
	if err != nil {
		return readTables{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads = slices.DeleteFunc(s.reads, func(name string) bool {
		_, ok := ct.byTable[name]
		return !ok
	})
	read := readTables{names: []string{}}
	for _, name := range s.reads {
		read.names = append(read.names, name)
		read.idents = append(read.idents, ct.byTable[name].Sanitize())
	}
	return read, nil
}

// learnReadTables adds the capture tables of claimed rows whose events a
// claim had to read apart to the tables claims read themselves, the oldest
// dropped past maxReadTables.
func (s *Store) learnReadTables(unread []candidate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.capture == nil {
		return
	}
	for _, cd := range unread {
		if cd.table == nil || slices.Contains(s.reads, *cd.table) {
			continue
		}
		if _, ok := s.capture.byTable[*cd.table]; !ok {
			continue // no capture trigger: set aside, never read
		}
		s.reads = append(s.reads, *cd.table)
		if len(s.reads) > maxReadTables {
			s.reads = slices.Delete(s.reads, 0, 1)
		}
	}
}
