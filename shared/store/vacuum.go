package store

import (
	"context"
	"log/slog"
)

// TargetVacuumEvery is how many backfill and replay pages a Store advances
// between two VACUUMs of the target table.
//
// Every page updates its target row (the cursor and verified_count, as the
// SDK's pages do). A target row of a real ontology is large (its manifest and
// selection: 1.4 KB in the test fixture), so a heap page holds about five of
// its versions, and PostgreSQL prunes a page only once it is nearly full:
// the sixth update cannot stay on the page and becomes a non-HOT update, with
// a new entry in the primary key. Each of a backfill page's 1,000
// foreign-key checks then walks every entry left behind, until autovacuum
// (at most once a minute per database) comes by: at 10⁶ rows backfill fell
// from 53,000 to 30,000 rows/s over the run, 38,000 rows/s overall. With the
// table vacuumed every 20 pages it holds 55,000–64,000 rows/s to the end.
//
// This is housekeeping the SDK does not do; it changes no row. VACUUM needs
// the table's owner (or, from PostgreSQL 16, the MAINTAIN privilege); for
// another role PostgreSQL skips the table with a warning, and the pages are
// as fast as autovacuum keeps them.
const TargetVacuumEvery = 20

// sqlVacuumTargets is the store's own statement (no seed): SKIP_LOCKED, so
// that it never waits behind autovacuum or another VACUUM of the table.
const sqlVacuumTargets = `VACUUM (SKIP_LOCKED) _ontology_replication_targets`

// targetRowUpdated counts a committed page and vacuums the target table
// every TargetVacuumEvery pages. The page is done whatever happens here, so
// a failure is logged, not returned.
func (s *Store) targetRowUpdated(ctx context.Context) {
	if s.targetUpdates.Add(1)%TargetVacuumEvery != 0 || ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
	defer cancel()
	if _, err := s.db.Exec(ctx, sqlVacuumTargets); err != nil && ctx.Err() == nil {
		s.cfg.Logger.WarnContext(ctx, "store: VACUUM of the target table failed; backfill and replay pages slow down until autovacuum runs",
			slog.Any("error", err))
	}
}
