package store

import "fmt"

// The seeds' page reads, which the store improves on, and the store's own,
// for the test that both select the same rows.
var (
	SeedBackfillBaselinePage = sqlBackfillBaselinePageSeed
	SeedBackfillHistoryPage  = sqlBackfillHistoryPageSeed
	SeedReplay               = [4]string{sqlReplayPageSeed, sqlReplayResetSeed, sqlReplayReceiptsSeed, sqlReplayCursorSeed}
	BackfillBaselinePages    = [2]string{sqlBackfillBaselineFirstPage, sqlBackfillBaselineNextPage}
	BackfillHistoryPages     = [2]string{sqlBackfillHistoryFirstPage, sqlBackfillHistoryNextPage}
	SeedBackfillInsert       = sqlBackfillInsertSeed
	SeedBackfillCursor       = sqlBackfillCursorSeed
	SeedBackfillEvents       = [2]string{sqlBackfillBaselineEventsSeed, sqlBackfillHistoryEventsSeed}
	ReplayNextPage           = fmt.Sprintf(sqlReplayPage, sqlReplayAfter)
	ReplayReceipts           = sqlReplayReceipts
)

// The seed's reads of a batch's events (baselines, a history table: %s) and
// the store's.
var (
	SeedEventReads = [2]string{sqlBaselineEventsSeed, sqlHistoryEventsSeed}
	EventReads     = [2]string{sqlBaselineEvents, sqlHistoryEvents}
)

// The seed's acknowledge, verify and retry statements and the store's.
var (
	SeedStateUpdates = [3]string{sqlAcknowledgeSeed, sqlVerifySeed, sqlRetrySeed}
	StateUpdates     = [3]string{sqlAcknowledge, sqlVerify, sqlRetry}
)

// SQLFigures is the figures read, for its plan.
var SQLFigures = sqlFigures

// Backoffs are a Store's set-aside backoffs in microseconds, as its
// statements take them.
func Backoffs(s *Store) []int64 { return s.backoffs }

// WaitedBefore is the figures read's fifth parameter.
func WaitedBefore(s *Store) []int64 { return s.waitedBefore }

// Defaults is the Config a zero Config becomes.
func Defaults() Config { return Config{}.withDefaults() }

// AuditTable and AuditHistoryPage are an audit's session table and its
// history page read (%s: the history table), for the page's plan.
var (
	AuditTable       = sqlAuditTable
	AuditHistoryPage = sqlAuditHistoryPage
)

// ClaimedHistoryRead is the claim's read of its rows' events from a history
// table (%s), for its plan.
var ClaimedHistoryRead = sqlPendingHistoryEvents

// FirstCandidates is the claim's first page of candidates, for its plan.
var FirstCandidates = candidatesStatement(nil, false)

// ReadTables are the history tables a Store's claims read in their own
// statement.
func ReadTables(s *Store) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.reads...)
}

// CandidatesReading is the claim's first page of candidates reading the
// events of the given tables (quoted identifiers), for its plan.
func CandidatesReading(idents ...string) string { return candidatesStatement(idents, false) }

// BeforeRelease makes fn run before each claim of s on a connection of
// its own releases its locks.
func BeforeRelease(s *Store, fn func()) { s.beforeRelease = fn }

// Out is how many of the session's claims are out.
func (ss *Session) Out() int { return ss.out }

// Pages is how many page statements the source's read took.
func (a *AuditSource) Pages() int { return a.pages }
