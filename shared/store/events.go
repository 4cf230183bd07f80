package store

// sqlBaselineEvents and sqlHistoryEvents are the per-table reads of
// pendingReplicationEvents (seed 000) with the id list as a uuid[] parameter
// instead of a JSON array (see Finding rows by key in the package doc): the
// same rows, found by primary key. %s is a history table's quoted identifier,
// checked against the capture-trigger tables.
const (
	sqlBaselineEvents = `SELECT id::text, event FROM _ontology_replication_baselines
             WHERE generation = $1::uuid AND id = ANY (ARRAY(SELECT unnest($2::uuid[])))`
	sqlHistoryEvents = `SELECT id::text, replication AS event FROM %s
             WHERE $1::uuid IS NOT NULL AND id = ANY (ARRAY(SELECT unnest($2::uuid[])))`
)
