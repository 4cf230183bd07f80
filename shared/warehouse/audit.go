package warehouse

import (
	"context"
	"fmt"
	"strconv"

	"cloud.google.com/go/bigquery"

	"github.com/segmentstream/ontology-replication/shared/registry"
)

// The warehouse side of an audit: the latest state of a target's records in
// the events table (the highest revision per record, as the views rank
// them; on a tie, which only a baseline restating a captured event makes,
// the tombstone, where the views take the higher event_id of the same
// state), up to a watermark revision, written
// as revision × 2 + deleted; buckets of records by the first hex digits of
// MD5(record_key), each with its count and the XOR of its records' hashes
// (the first 15 hex digits of MD5(record_key || ':' || latest state) read as
// an integer). The store computes the same figures from the source
// (store.AuditBuckets): the two sides agree bucket for bucket when the
// warehouse holds the source's latest state of every record.
//
// One audit runs at most two queries per workspace: the buckets of every
// audited entity, then, when some differ, the records of the differing
// buckets. Each reads the generation's rows of seven columns (generation,
// source_id, entity_id, record_kind, record_key, revision, deleted; never
// payload); the table's clustering on generation keeps other generations'
// blocks out. Every value is a query parameter.

// AuditQuery is what an audit asks the warehouse: the target's generation
// and source, the entities audited, the watermark revision and how many hex
// digits of MD5(record_key) make a bucket.
type AuditQuery struct {
	Generation string
	SourceID   string
	EntityIDs  []string
	Watermark  int64
	Digits     int
}

// AuditBucket is a bucket of the warehouse's records: an entity, a record
// kind and the hex digits the MD5 of its records' keys starts with; how many
// records it holds and the XOR of their hashes.
type AuditBucket struct {
	EntityID string
	Kind     string
	Bucket   string
	Records  int64
	Checksum int64
}

// AuditRecord is a record's latest state in the warehouse: its latest
// revision and whether that is a tombstone.
type AuditRecord struct {
	EntityID string
	Kind     string
	Key      string
	Revision int64
	Deleted  bool
}

// sqlAuditLatest is the latest state of the audited records (%s: the
// filter on the table's rows beyond generation, source, entities and
// watermark).
const sqlAuditLatest = `SELECT entity_id, record_kind, record_key, MAX(revision * 2 + IF(deleted, 1, 0)) AS latest
    FROM %s
    WHERE generation = @generation AND source_id = @source_id AND entity_id IN UNNEST(@entities)
      AND revision <= @watermark%s
    GROUP BY entity_id, record_kind, record_key`

// sqlAuditBuckets groups the latest states into buckets (%s:
// sqlAuditLatest). Figures are returned as strings, as every BigQuery
// answer carries them.
const sqlAuditBuckets = `SELECT entity_id, record_kind, SUBSTR(TO_HEX(MD5(record_key)), 1, @digits) AS bucket,
    CAST(COUNT(*) AS STRING) AS records,
    CAST(BIT_XOR(CAST(CONCAT('0x', SUBSTR(TO_HEX(MD5(CONCAT(record_key, ':', CAST(CAST(latest AS INT64) AS STRING)))), 1, 15)) AS INT64)) AS STRING) AS checksum
  FROM (%s)
  GROUP BY entity_id, record_kind, bucket`

// sqlAuditRecords lists the latest states of the records in the given
// buckets (%s: sqlAuditLatest).
const sqlAuditRecords = `SELECT entity_id, record_kind, record_key, CAST(CAST(latest AS INT64) AS STRING) AS latest
  FROM (%s)
  WHERE SUBSTR(TO_HEX(MD5(record_key)), 1, @digits) IN UNNEST(@buckets)`

// sqlAuditKeys restricts the latest states to chosen records.
const sqlAuditKeys = `
      AND record_key IN UNNEST(@keys)`

func (q AuditQuery) params() []bigquery.QueryParameter {
	return []bigquery.QueryParameter{
		{Name: "generation", Value: q.Generation},
		{Name: "source_id", Value: q.SourceID},
		{Name: "entities", Value: q.EntityIDs},
		{Name: "watermark", Value: q.Watermark},
		{Name: "digits", Value: int64(q.Digits)},
	}
}

func (q AuditQuery) validate() error {
	if len(q.EntityIDs) == 0 {
		return fmt.Errorf("no entity to audit")
	}
	if q.Digits < 1 || q.Digits > 32 {
		return fmt.Errorf("bucket digits %d: want 1 to 32", q.Digits)
	}
	return nil
}

// AuditBuckets returns the buckets of the warehouse's latest states: one
// parameterised query.
func (b *BigQuery) AuditBuckets(ctx context.Context, table registry.BigQuery, q AuditQuery) ([]AuditBucket, error) {
	if err := q.validate(); err != nil {
		return nil, fmt.Errorf("warehouse: audit of %s: %w", tableRef(table), err)
	}
	sql := fmt.Sprintf(sqlAuditBuckets, fmt.Sprintf(sqlAuditLatest, tableRef(table), ""))
	var out []AuditBucket
	err := b.readRows(ctx, table, "audit buckets", b.cfg.AuditTimeout, sql, q.params(), func(raw []bigquery.Value) error {
		row, err := answerStrings(raw, 5)
		if err != nil {
			return err
		}
		records, err := strconv.ParseInt(row[3], 10, 64)
		if err != nil {
			return fmt.Errorf("records %q: %w", row[3], err)
		}
		sum, err := strconv.ParseInt(row[4], 10, 64)
		if err != nil {
			return fmt.Errorf("checksum %q: %w", row[4], err)
		}
		out = append(out, AuditBucket{EntityID: row[0], Kind: row[1], Bucket: row[2], Records: records, Checksum: sum})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// AuditRecords returns the warehouse's latest state of the records in the
// given buckets (of q.Digits digits) or, when keys is not nil, of those
// records only: one parameterised query.
func (b *BigQuery) AuditRecords(ctx context.Context, table registry.BigQuery, q AuditQuery, buckets, keys []string) ([]AuditRecord, error) {
	if err := q.validate(); err != nil {
		return nil, fmt.Errorf("warehouse: audit of %s: %w", tableRef(table), err)
	}
	if len(buckets) == 0 {
		return nil, nil
	}
	params := append(q.params(), bigquery.QueryParameter{Name: "buckets", Value: buckets})
	filter := ""
	if keys != nil {
		filter = sqlAuditKeys
		params = append(params, bigquery.QueryParameter{Name: "keys", Value: keys})
	}
	sql := fmt.Sprintf(sqlAuditRecords, fmt.Sprintf(sqlAuditLatest, tableRef(table), filter))
	var out []AuditRecord
	err := b.readRows(ctx, table, "audit records", b.cfg.AuditTimeout, sql, params, func(raw []bigquery.Value) error {
		row, err := answerStrings(raw, 4)
		if err != nil {
			return err
		}
		latest, err := strconv.ParseInt(row[3], 10, 64)
		if err != nil || latest < 0 {
			return fmt.Errorf("latest state %q: not a revision", row[3])
		}
		out = append(out, AuditRecord{EntityID: row[0], Kind: row[1], Key: row[2], Revision: latest / 2, Deleted: latest%2 == 1})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// answerStrings reads an answer row of columns strings: every figure of an
// audit's answer is cast to a string in its SQL, as BigQuery's JSON rows
// carry them.
func answerStrings(row []bigquery.Value, columns int) ([]string, error) {
	if len(row) != columns {
		return nil, fmt.Errorf("an answer row has %d columns, want %d", len(row), columns)
	}
	cells := make([]string, columns)
	for i, v := range row {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("column %d of an answer row is %T, want a string", i, v)
		}
		cells[i] = s
	}
	return cells, nil
}
