package store

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
)
