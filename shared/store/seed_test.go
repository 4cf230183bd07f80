package store

// The seeds' own statements, which the store improves on. Only the tests
// run them, beside the store's, to show that both leave the same database.
// Each is copied from the seed named (replication/store.js of SDK 0.25.0,
// seed 000); %s is a history table's quoted identifier where the seed
// interpolates one.

// pendingReplicationEvents: the per-table event reads.
const (
	sqlBaselineEventsSeed = `SELECT id::text, event FROM _ontology_replication_baselines
             WHERE generation = $1::uuid AND id IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))`
	sqlHistoryEventsSeed = `SELECT id::text, replication AS event FROM %s
             WHERE $1::uuid IS NOT NULL AND id IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))`
)

// acknowledgeReplicationV4, after shareReplicationLifecycle.
const sqlAcknowledgeSeed = `WITH accepted AS (
          UPDATE _ontology_replication_delivery SET accepted_at = now(), next_verify_at = now()
          WHERE generation = $1::uuid AND accepted_at IS NULL
            AND event_id IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))
          RETURNING event_id, accepted_at
        ) INSERT INTO _ontology_replication_receipts (generation, event_id, accepted_at)
          SELECT $1::uuid, event_id, accepted_at FROM accepted ON CONFLICT DO NOTHING`

// verifyReplicationEventsV4, with a RETURNING clause added so that the test
// can compare the counts (nothing else differs).
const sqlVerifySeed = `WITH locked AS MATERIALIZED (
      SELECT generation FROM _ontology_replication_targets WHERE generation = $1::uuid FOR NO KEY UPDATE
    ), verified AS (
      UPDATE _ontology_replication_delivery SET verified_at = now(), last_checked_at = now()
      WHERE generation = (SELECT generation FROM locked) AND accepted_at IS NOT NULL AND verified_at IS NULL
        AND event_id IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))
      RETURNING event_id, verified_at
    ), receipts AS (
      UPDATE _ontology_replication_receipts r SET verified_at = v.verified_at FROM verified v
      WHERE r.generation = $1::uuid AND r.event_id = v.event_id
    ) UPDATE _ontology_replication_targets SET verified_count = verified_count + (SELECT count(*) FROM verified)
      WHERE generation = $1::uuid RETURNING (SELECT count(*) FROM verified)`

// retryUnverifiedReplicationV4.
const sqlRetrySeed = `WITH checked AS (
      UPDATE _ontology_replication_delivery SET last_checked_at = now(), next_verify_at = now() + interval '30 seconds',
        accepted_at = CASE WHEN accepted_at < now() - interval '15 minutes' THEN NULL ELSE accepted_at END
      WHERE generation = $1::uuid AND accepted_at IS NOT NULL AND verified_at IS NULL
        AND event_id IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))
      RETURNING event_id, accepted_at
    ) DELETE FROM _ontology_replication_receipts r USING checked c
      WHERE r.generation = $1::uuid AND r.event_id = c.event_id AND c.accepted_at IS NULL`

// advanceReplicationReplay: the page read, the reset, the receipts and the
// cursor, the ids passed as a JSON array.
const (
	sqlReplayPageSeed = `SELECT event_id::text AS id, verified_at IS NOT NULL AS verified FROM _ontology_replication_delivery
       WHERE generation = $1::uuid AND ($2::uuid IS NULL OR event_id > $2::uuid)
         AND (is_baseline OR revision <= $3::bigint)
       ORDER BY event_id LIMIT 1000`
	sqlReplayResetSeed = `UPDATE _ontology_replication_delivery SET accepted_at = NULL, verified_at = NULL, next_verify_at = now()
       WHERE generation = $1::uuid AND event_id IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))`
	sqlReplayReceiptsSeed = `DELETE FROM _ontology_replication_receipts WHERE generation = $1::uuid
       AND event_id IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))`
	sqlReplayCursorSeed = `UPDATE _ontology_replication_targets SET replay_cursor = $2::uuid, replay_complete = $3,
        verified_count = verified_count - $4::bigint WHERE generation = $1::uuid`
)

// advanceReplicationBackfill: the page reads (the cursor as
// ($2::uuid IS NULL OR id > $2::uuid), ORDER BY the output column id::text),
// the insert with its event sources, and the cursor update.
const (
	sqlBackfillBaselinePageSeed = `SELECT id::text FROM _ontology_replication_baselines WHERE generation = $1::uuid
           AND ($2::uuid IS NULL OR id > $2::uuid) ORDER BY id LIMIT 1000`
	sqlBackfillHistoryPageSeed = `SELECT id::text FROM %s WHERE replication IS NOT NULL
           AND replication->>'source_id' = $3 AND (replication->>'revision')::bigint > $4::bigint
           AND (replication->>'revision')::bigint <= $5::bigint
           AND ($2::uuid IS NULL OR id > $2::uuid) AND $1::uuid IS NOT NULL ORDER BY id LIMIT 1000`
	sqlBackfillInsertSeed = `WITH inserted AS (
        INSERT INTO _ontology_replication_delivery
          (generation, event_id, history_table, revision, is_baseline, accepted_at, verified_at, next_verify_at)
        SELECT $1::uuid, e.id, $3::text, (e.event->>'revision')::bigint, $4::boolean,
          r.accepted_at, r.verified_at, now() FROM (%s) e
        LEFT JOIN _ontology_replication_receipts r ON r.generation = $1::uuid AND r.event_id = e.id
        WHERE e.id IN (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))
        ON CONFLICT DO NOTHING RETURNING verified_at
      ) UPDATE _ontology_replication_targets SET verified_count = verified_count +
        (SELECT count(verified_at) FROM inserted) WHERE generation = $1::uuid`
	sqlBackfillBaselineEventsSeed = `SELECT id, event FROM _ontology_replication_baselines WHERE generation = $1::uuid`
	sqlBackfillHistoryEventsSeed  = `SELECT id, replication AS event FROM %s`
	sqlBackfillCursorSeed         = `UPDATE _ontology_replication_targets SET backfill_cursor = $2::jsonb, backfill_complete = $3
       WHERE generation = $1::uuid`
)
