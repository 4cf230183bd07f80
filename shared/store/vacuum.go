package store

import (
	"context"
	"log/slog"
)

// TargetVacuumEvery is how many backfill and replay pages a Store advances
// between two VACUUMs of the target table.
//
// Every page updates its target row (the cursor and verified_count, as the
// SDK's pages do). A target row of a real ontology is large (its manifest
// and selection), so a heap page holds only a few of its versions, and
// PostgreSQL prunes a page only once it is nearly full: the update that
// cannot stay on the page becomes a non-HOT update, with a new entry in the
// primary key. Each of a backfill page's 1,000 foreign-key checks then walks
// every entry left behind, until autovacuum (at most once a minute per
// database) comes by, so a long backfill slows down as it runs; vacuumed
// every 20 pages, it keeps its rate (the README's performance table).
//
// This is housekeeping the SDK does not do; it changes no row. VACUUM needs
// the table's owner (or, from PostgreSQL 16, the MAINTAIN privilege); for
// another role PostgreSQL skips the table with a warning, which the store
// logs once (see targetRowUpdated), and the pages are as fast as autovacuum
// keeps them.
const TargetVacuumEvery = 20

// sqlVacuumTargets is the store's own statement (no seed): SKIP_LOCKED, so
// that it never waits behind autovacuum or another VACUUM of the table.
const sqlVacuumTargets = `VACUUM (SKIP_LOCKED) _ontology_replication_targets`

// sqlMayVacuumTargets reports whether this role may VACUUM the target
// table: as its owner (or a member of the owning role, or a superuser), or,
// from PostgreSQL 16, with the MAINTAIN privilege. Without it PostgreSQL
// skips the table with a WARNING that reaches no log of ours, so the store
// asks first and says so once.
const sqlMayVacuumTargets = `SELECT pg_has_role(c.relowner, 'MEMBER')
         OR (current_setting('server_version_num')::int >= 160000
             AND has_table_privilege(c.oid, 'MAINTAIN'))
    FROM pg_class c WHERE c.oid = '_ontology_replication_targets'::regclass`

// targetRowUpdated counts a committed page and vacuums the target table
// every TargetVacuumEvery pages. The page is done whatever happens here, so
// a failure is logged, not returned.
func (s *Store) targetRowUpdated(ctx context.Context) {
	if s.targetUpdates.Add(1)%TargetVacuumEvery != 0 || ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
	defer cancel()
	may := s.mayVacuum.Load()
	if may == nil {
		var ok bool
		if err := s.db.QueryRow(ctx, sqlMayVacuumTargets).Scan(&ok); err != nil {
			if ctx.Err() == nil {
				s.cfg.Logger.WarnContext(ctx, "replication: store: could not check the VACUUM privilege on the target table", slog.Any("error", err))
			}
			return
		}
		may = &ok
		s.mayVacuum.Store(may)
		if !ok {
			s.cfg.Logger.WarnContext(ctx, "replication: store: this role may not VACUUM _ontology_replication_targets (it needs ownership, or MAINTAIN on PostgreSQL 16 and later); long backfills and replays slow down between autovacuum runs")
		}
	}
	if !*may {
		return
	}
	if _, err := s.db.Exec(ctx, sqlVacuumTargets); err != nil && ctx.Err() == nil {
		s.cfg.Logger.WarnContext(ctx, "replication: store: VACUUM of the target table failed; backfill and replay pages slow down until autovacuum runs",
			slog.Any("error", err))
	}
}
