package store_test

import (
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// oracleBuckets computes an entity's audit buckets in Go from its captured
// events (history rows of the target's source after its from_revision, and
// its baselines) up to the watermark, by the rule the package documents:
// latest state = max(revision × 2 + deleted), hash = the first 15 hex
// digits of md5("<key>:<latest>"), buckets by the first digits of
// md5(key), checksum XOR.
func oracleBuckets(t *testing.T, e *env, tg store.Target, entity, history string, watermark int64) map[string]store.AuditBucket {
	t.Helper()
	rows, err := e.pool.Query(e.ctx, `SELECT replication FROM `+history+` WHERE replication IS NOT NULL
	  UNION ALL SELECT event FROM _ontology_replication_baselines WHERE generation = $1::uuid`, tg.Generation)
	require.NoError(t, err)
	latest := map[[2]string]int64{}
	for rows.Next() {
		var raw []byte
		require.NoError(t, rows.Scan(&raw))
		var ev struct {
			SourceID   string `json:"source_id"`
			EntityID   string `json:"entity_id"`
			RecordKey  string `json:"record_key"`
			RecordKind string `json:"record_kind"`
			Revision   string `json:"revision"`
			Deleted    bool   `json:"deleted"`
		}
		require.NoError(t, json.Unmarshal(raw, &ev))
		rev, err := strconv.ParseInt(ev.Revision, 10, 64)
		require.NoError(t, err)
		if ev.EntityID != entity || ev.SourceID != tg.SourceID || rev > watermark {
			continue
		}
		m := rev * 2
		if ev.Deleted {
			m++
		}
		k := [2]string{ev.RecordKind, ev.RecordKey}
		if old, ok := latest[k]; !ok || m > old {
			latest[k] = m
		}
	}
	require.NoError(t, rows.Err())
	out := map[string]store.AuditBucket{}
	for k, m := range latest {
		keySum := md5.Sum([]byte(k[1]))
		bucket := hex.EncodeToString(keySum[:])[:store.AuditBucketDigits]
		sum := md5.Sum([]byte(k[1] + ":" + strconv.FormatInt(m, 10)))
		hash, err := strconv.ParseInt(hex.EncodeToString(sum[:])[:15], 16, 64)
		require.NoError(t, err)
		b := out[k[0]+"/"+bucket]
		b.EntityID, b.Kind, b.Bucket = entity, k[0], bucket
		b.Records++
		b.Checksum ^= hash
		out[k[0]+"/"+bucket] = b
	}
	return out
}

func bucketMap(bs []store.AuditBucket) map[string]store.AuditBucket {
	out := map[string]store.AuditBucket{}
	for _, b := range bs {
		out[b.Kind+"/"+b.Bucket] = b
	}
	return out
}

// auditBuckets reads an entity's buckets through an AuditSource of its own.
func auditBuckets(t *testing.T, e *env, st *store.Store, tg store.Target, entity string, watermark int64) []store.AuditBucket {
	t.Helper()
	src, err := st.OpenAudit(e.ctx, tg, watermark, []string{entity})
	require.NoError(t, err)
	defer src.Close(e.ctx)
	b, err := src.Buckets(e.ctx, entity)
	require.NoError(t, err)
	return b
}

// TestAuditBucketsAsOfTheWatermark: the source's buckets are the documented
// figures of the events captured up to the watermark, computed again in Go
// (baseline and history events, edges and tombstones included), whatever
// the page size of the source's read (one page; pages of 7 events, so that
// a record's events fall in different pages, including its baseline and
// its tombstone); events written after the watermark change nothing until
// a later watermark takes them; an update changes its bucket's checksum and
// not its count.
func TestAuditBucketsAsOfTheWatermark(t *testing.T) {
	for _, tpl := range []struct {
		name string
		tpl  *pgtest.Template
	}{{"protocol 4", &sdkfixture.V4Template}, {"protocol 3", &sdkfixture.V3Template}} {
		t.Run(tpl.name, func(t *testing.T) {
			e := newEnv(t, tpl.tpl)
			early := e.products(t, 30) // in the baseline
			tg := e.start(t)
			ids := e.products(t, 300)
			require.NoError(t, e.w.Update(e.ctx, "product", ids[0], map[string]any{"title": "again"}))
			require.NoError(t, e.w.Delete(e.ctx, "product", early[0]))
			require.NoError(t, e.w.Update(e.ctx, "product", early[1], map[string]any{"title": "after its baseline"}))
			order, err := e.w.Create(e.ctx, "order", map[string]any{"reference": "o"})
			require.NoError(t, err)
			require.NoError(t, e.w.Link(e.ctx, "order", "products", order, ids[1]))

			mark, err := e.store.AuditMark(e.ctx, tg)
			require.NoError(t, err)
			want := oracleBuckets(t, e, tg, "ent_product", `"product_history"`, mark.Revision)
			got := auditBuckets(t, e, e.store, tg, "ent_product", mark.Revision)
			require.Equal(t, want, bucketMap(got))
			paged, err := store.New(e.pool, store.Config{AuditPageEvents: 7})
			require.NoError(t, err)
			require.Equal(t, want, bucketMap(auditBuckets(t, e, paged, tg, "ent_product", mark.Revision)), "read in pages of 7 events")
			var records int64
			for _, b := range got {
				records += b.Records
			}
			require.EqualValues(t, 330, records, "every product once, the deleted one as its tombstone")
			edges := auditBuckets(t, e, e.store, tg, "ent_order", mark.Revision)
			require.Equal(t, oracleBuckets(t, e, tg, "ent_order", `"order_history"`, mark.Revision), bucketMap(edges))
			require.Equal(t, bucketMap(edges), bucketMap(auditBuckets(t, e, paged, tg, "ent_order", mark.Revision)))
			require.True(t, slices.ContainsFunc(edges, func(b store.AuditBucket) bool { return b.Kind == "edge:products" }))

			// Later writes: not part of this watermark's audit.
			require.NoError(t, e.w.Update(e.ctx, "product", ids[2], map[string]any{"title": "later"}))
			e.products(t, 5)
			again := auditBuckets(t, e, e.store, tg, "ent_product", mark.Revision)
			require.Equal(t, bucketMap(got), bucketMap(again), "the watermark holds the audit still")

			later, err := e.store.AuditMark(e.ctx, tg)
			require.NoError(t, err)
			require.Greater(t, later.Revision, mark.Revision)
			now := auditBuckets(t, e, paged, tg, "ent_product", later.Revision)
			require.Equal(t, oracleBuckets(t, e, tg, "ent_product", `"product_history"`, later.Revision), bucketMap(now))
			key := ids[2]
			sum := md5.Sum([]byte(key))
			bucket := "entity/" + hex.EncodeToString(sum[:])[:store.AuditBucketDigits]
			before, after := bucketMap(got)[bucket], bucketMap(now)[bucket]
			if after.Records == before.Records { // no new product fell in the same bucket
				require.NotEqual(t, before.Checksum, after.Checksum, "the update changed its bucket's checksum")
			}
		})
	}
}

// TestAuditSourceStatementsArePages: every statement of an audit's source
// read reads at most a page of events, whatever the entity's history
// holds: with pages of 50 events and 1,000 products, no statement of the
// session returns or scans more than a page (pg_stat_statements would say
// the same; the plan is the evidence here), and the session's table is
// gone once the source is closed.
func TestAuditSourceStatementsArePages(t *testing.T) {
	e := newEnv(t, &sdkfixture.V4Template)
	e.products(t, 20)
	tg := e.start(t)
	require.NoError(t, sdkfixture.BulkCreate(e.ctx, e.pool, sdkfixture.Demo, "product", "title", 1000, 1000))
	mark, err := e.store.AuditMark(e.ctx, tg)
	require.NoError(t, err)
	paged, err := store.New(e.pool, store.Config{AuditPageEvents: 50})
	require.NoError(t, err)
	// Each page's history read walks the seed's revision index from the
	// cursor, under the page's LIMIT: the product's statement's plan says so.
	e.exec(t, `ANALYZE product_history`)
	conn, err := e.pool.Acquire(e.ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(e.ctx, store.AuditTable)
	require.NoError(t, err)
	rows, err := conn.Query(e.ctx, "EXPLAIN (FORMAT TEXT) "+fmt.Sprintf(store.AuditHistoryPage, `"product_history"`),
		tg.SourceID, tg.FromRevision, mark.Revision, 50, "ent_product")
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NoError(t, conn.Conn().Close(e.ctx)) // and its table with it
	plan := strings.Join(lines, "\n")
	require.Regexp(t, `Index Scan using "?_replication_\w+_idx"? on product_history`, plan)
	require.NotContains(t, plan, "Seq Scan on product_history", plan)
	src, err := paged.OpenAudit(e.ctx, tg, mark.Revision, []string{"ent_product"})
	require.NoError(t, err)
	b, err := src.Buckets(e.ctx, "ent_product")
	require.NoError(t, err)
	require.Equal(t, oracleBuckets(t, e, tg, "ent_product", `"product_history"`, mark.Revision), bucketMap(b))
	src.Close(e.ctx)
	var baselines, history int
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT count(*) FROM _ontology_replication_baselines`).Scan(&baselines))
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT count(*) FROM product_history WHERE replication IS NOT NULL
	  AND (replication->>'revision')::bigint > $1::bigint AND (replication->>'revision')::bigint <= $2::bigint`, tg.FromRevision, mark.Revision).Scan(&history))
	require.Equal(t, 1000, history)
	require.Equal(t, baselines/50+1+history/50+1, src.Pages(), "pages of at most 50 events, the last one short")
	var tables int
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT count(*) FROM pg_class WHERE relname = '_ontology_replication_audit'`).Scan(&tables))
	require.Zero(t, tables, "the session's table is dropped on Close")
}

// TestAuditRecordsReadTheLatestEventAndItsVerification: the records of
// chosen buckets or keys come with their latest event's history id,
// revision and deleted flag, and when it was verified, whatever the page
// size of the source's read (in pages of 2 events a record's create, update
// and tombstone fall in different pages).
func TestAuditRecordsReadTheLatestEventAndItsVerification(t *testing.T) {
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	ids := e.products(t, 3)
	require.NoError(t, e.w.Update(e.ctx, "product", ids[0], map[string]any{"title": "again"}))
	require.NoError(t, e.w.Delete(e.ctx, "product", ids[1]))
	e.drainAll(t, tg)
	updated, err := sdkfixture.HistoryID(e.ctx, e.pool, sdkfixture.Demo, "product", ids[0], "update")
	require.NoError(t, err)
	_, err = e.store.VerifyEvents(e.ctx, tg, []string{updated})
	require.NoError(t, err)
	mark, err := e.store.AuditMark(e.ctx, tg)
	require.NoError(t, err)

	all := make([]string, 16)
	for i := range all {
		all[i] = fmt.Sprintf("%x", i)
	}
	for _, pageEvents := range []int{0, 2} {
		t.Run(fmt.Sprintf("pages of %d events", pageEvents), func(t *testing.T) {
			st, err := store.New(e.pool, store.Config{AuditPageEvents: pageEvents})
			require.NoError(t, err)
			src, err := st.OpenAudit(e.ctx, tg, mark.Revision, []string{"ent_product"})
			require.NoError(t, err)
			defer src.Close(e.ctx)
			recs, err := src.Records(e.ctx, "ent_product", all, []string{ids[0], ids[1]})
			require.NoError(t, err)
			require.Len(t, recs, 2, "only the chosen keys")
			byKey := map[string]store.AuditRecord{}
			for _, r := range recs {
				byKey[r.Key] = r
			}
			require.Equal(t, updated, byKey[ids[0]].HistoryID, "the latest event: the update")
			require.NotNil(t, byKey[ids[0]].VerifiedAt)
			require.False(t, byKey[ids[0]].Deleted)
			require.True(t, byKey[ids[1]].Deleted, "the tombstone is the latest")
			require.Nil(t, byKey[ids[1]].VerifiedAt, "accepted, not verified")
			require.Greater(t, byKey[ids[1]].Revision, byKey[ids[0]].Revision)
		})
	}
}

// TestRedeliverTouchesOnlyItsGeneration: a repair's reset sends the chosen
// accepted events of its generation back to pending, drops their receipts
// and keeps verified_count true; the same history ids in another
// generation, and rows already pending, are left as they were.
func TestRedeliverTouchesOnlyItsGeneration(t *testing.T) {
	e := newEnv(t, &sdkfixture.V4Template)
	first := e.start(t)
	e.products(t, 4)
	ids := e.drainAll(t, first)
	require.Len(t, ids, 4)
	_, err := e.store.VerifyEvents(e.ctx, first, ids[:3])
	require.NoError(t, err)
	require.NoError(t, sdkfixture.Pause(e.ctx, e.pool))
	second := e.start(t)
	// The same events in the second generation, accepted and verified (as a
	// backfill carries receipts over).
	e.exec(t, `INSERT INTO _ontology_replication_delivery (generation, event_id, history_table, revision, accepted_at, verified_at)
	  SELECT $1::uuid, event_id, history_table, revision, now(), now() FROM _ontology_replication_delivery WHERE generation = $2::uuid`,
		second.Generation, first.Generation)
	e.exec(t, `INSERT INTO _ontology_replication_receipts (generation, event_id, verified_at)
	  SELECT $1::uuid, event_id, now() FROM _ontology_replication_delivery WHERE generation = $2::uuid`, second.Generation, first.Generation)
	e.exec(t, `UPDATE _ontology_replication_targets SET verified_count = 4 WHERE generation = $1::uuid`, second.Generation)
	first, err = e.store.Target(e.ctx, first.Generation)
	require.NoError(t, err)
	require.EqualValues(t, 3, first.VerifiedCount)

	done, err := e.store.Redeliver(e.ctx, first, ids[:2])
	require.NoError(t, err)
	require.Equal(t, store.Redelivered{Rows: 2, Verified: 2}, done)
	again, err := e.store.Redeliver(e.ctx, first, ids[:2])
	require.NoError(t, err)
	require.Zero(t, again.Rows, "already pending: left alone")

	pending := func(g string) int64 {
		return e.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE generation = $1::uuid AND accepted_at IS NULL
		  AND event_id = ANY ($2::uuid[])`, g, ids)
	}
	require.EqualValues(t, 2, pending(first.Generation))
	require.EqualValues(t, 2, e.count(t, `SELECT count(*) FROM _ontology_replication_receipts WHERE generation = $1::uuid`, first.Generation))
	require.EqualValues(t, 1, e.count(t, `SELECT verified_count FROM _ontology_replication_targets WHERE generation = $1::uuid`, first.Generation))
	require.Zero(t, pending(second.Generation), "the other generation's rows untouched")
	require.EqualValues(t, 4, e.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE generation = $1::uuid AND verified_at IS NOT NULL
	  AND event_id = ANY ($2::uuid[])`, second.Generation, ids))
	require.EqualValues(t, 4, e.count(t, `SELECT count(*) FROM _ontology_replication_receipts WHERE generation = $1::uuid`, second.Generation))
	require.EqualValues(t, 4, e.count(t, `SELECT verified_count FROM _ontology_replication_targets WHERE generation = $1::uuid`, second.Generation))
}

// TestMergeBuckets: buckets merge by prefix, counts adding and checksums
// XOR-ing, so a merge of the store's buckets equals buckets of fewer
// digits computed directly.
func TestMergeBuckets(t *testing.T) {
	in := []store.AuditBucket{
		{EntityID: "e", Kind: "entity", Bucket: "a01", Records: 2, Checksum: 0b1100},
		{EntityID: "e", Kind: "entity", Bucket: "a02", Records: 3, Checksum: 0b1010},
		{EntityID: "e", Kind: "edge:r", Bucket: "a03", Records: 1, Checksum: 7},
		{EntityID: "e", Kind: "entity", Bucket: "b00", Records: 1, Checksum: 1},
	}
	require.Equal(t, []store.AuditBucket{
		{EntityID: "e", Kind: "entity", Bucket: "a", Records: 5, Checksum: 0b0110},
		{EntityID: "e", Kind: "edge:r", Bucket: "a", Records: 1, Checksum: 7},
		{EntityID: "e", Kind: "entity", Bucket: "b", Records: 1, Checksum: 1},
	}, store.MergeBuckets(in, 1))
}

// TestAuditSourceOutlivesAClaimsIdleTimeout: a session a claim used keeps
// the claim's idle_session_timeout; an audit on it waits for BigQuery for
// longer than that with its table intact.
func TestAuditSourceOutlivesAClaimsIdleTimeout(t *testing.T) {
	e := newEnv(t, &sdkfixture.V4Template)
	tg := e.start(t)
	e.products(t, 5)
	mark, err := e.store.AuditMark(e.ctx, tg)
	require.NoError(t, err)
	one, err := pgxpool.New(e.ctx, e.pool.Config().ConnString()+"&pool_max_conns=1")
	require.NoError(t, err)
	t.Cleanup(one.Close)
	// What a claim leaves on its session (sqlClaimSession), shortened.
	_, err = one.Exec(e.ctx, `SELECT set_config('idle_session_timeout', '200ms', false)`)
	require.NoError(t, err)
	st, err := store.New(one, store.Config{})
	require.NoError(t, err)
	src, err := st.OpenAudit(e.ctx, tg, mark.Revision, []string{"ent_product"})
	require.NoError(t, err)
	defer src.Close(e.ctx)
	time.Sleep(time.Second) // the audit asks BigQuery meanwhile: idle, past the claim's timeout
	b, err := src.Buckets(e.ctx, "ent_product")
	require.NoError(t, err, "the session and its table outlived the idle timeout")
	require.Equal(t, oracleBuckets(t, e, tg, "ent_product", `"product_history"`, mark.Revision), bucketMap(b))
}
