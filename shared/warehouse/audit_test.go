package warehouse_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

func ptr(s string) *string { return &s }

// TestAuditQueries: the audit's two queries go through the real client with
// every value a parameter (none pasted into the SQL), judge up to the
// watermark on the columns the views rank by, bucket by MD5(record_key),
// hash the latest state with the key, and read their paged answers.
func TestAuditQueries(t *testing.T) {
	t.Parallel()
	var asked []bqserver.Query
	srv := bqserver.New(func(_ context.Context, q bqserver.Query) (bqserver.Result, error) {
		asked = append(asked, q)
		if _, records := q.Params["buckets"]; records {
			return bqserver.Result{Columns: []string{"entity_id", "record_kind", "record_key", "latest"},
				Rows: [][]*string{{ptr("ent_a"), ptr("entity"), ptr("k1"), ptr("21")}, {ptr("ent_a"), ptr("edge:r"), ptr("k1:k2"), ptr("8")}}}, nil
		}
		return bqserver.Result{Columns: []string{"entity_id", "record_kind", "bucket", "records", "checksum"},
			Rows: [][]*string{{ptr("ent_a"), ptr("entity"), ptr("0"), ptr("3"), ptr("-5")}, {ptr("ent_b"), ptr("entity"), ptr("f"), ptr("1"), ptr("42")}}}, nil
	})
	srv.PageSize = 1
	hs := httptest.NewServer(srv)
	defer hs.Close()
	wh, err := warehouse.NewBigQuery(warehouse.Config{})
	require.NoError(t, err)
	defer wh.Close()
	table := registry.BigQuery{Project: "p1", Dataset: "ontology_internal", Table: "events", Location: "EU", Endpoint: hs.URL}
	q := warehouse.AuditQuery{Generation: "0f8fad5b-d9cb-469f-a165-70867728950e", SourceID: "7c9e6679-7425-40de-944b-e07fc1f90ae7",
		EntityIDs: []string{"ent_a", "ent_b"}, Watermark: 123456, Digits: 2}

	buckets, err := wh.AuditBuckets(context.Background(), table, q)
	require.NoError(t, err)
	require.Equal(t, []warehouse.AuditBucket{{EntityID: "ent_a", Kind: "entity", Bucket: "0", Records: 3, Checksum: -5},
		{EntityID: "ent_b", Kind: "entity", Bucket: "f", Records: 1, Checksum: 42}}, buckets, "every page read")
	records, err := wh.AuditRecords(context.Background(), table, q, []string{"0a", "ff"}, []string{"k1"})
	require.NoError(t, err)
	require.Equal(t, []warehouse.AuditRecord{{EntityID: "ent_a", Kind: "entity", Key: "k1", Revision: 10, Deleted: true},
		{EntityID: "ent_a", Kind: "edge:r", Key: "k1:k2", Revision: 4}}, records, "latest state = revision × 2 + deleted")
	none, err := wh.AuditRecords(context.Background(), table, q, nil, nil)
	require.NoError(t, err)
	require.Empty(t, none)
	require.Len(t, asked, 2, "no query for no bucket")

	for i, a := range asked {
		require.Equal(t, "EU", a.Location)
		for _, pasted := range []string{q.Generation, q.SourceID, "ent_a", "123456", "0a", "k1"} {
			require.NotContains(t, a.SQL, pasted, "values are parameters")
		}
		require.Equal(t, q.Generation, a.Params["generation"].Value)
		require.Equal(t, q.SourceID, a.Params["source_id"].Value)
		require.Equal(t, q.EntityIDs, a.Params["entities"].Values)
		require.Equal(t, "123456", a.Params["watermark"].Value)
		require.Equal(t, "2", a.Params["digits"].Value)
		for _, part := range []string{"FROM `p1.ontology_internal.events`", "generation = @generation", "source_id = @source_id",
			"entity_id IN UNNEST(@entities)", "revision <= @watermark", "MAX(revision * 2 + IF(deleted, 1, 0))",
			"GROUP BY entity_id, record_kind, record_key", "SUBSTR(TO_HEX(MD5(record_key)), 1, @digits)"} {
			require.Contains(t, a.SQL, part, "query %d", i)
		}
		require.NotContains(t, a.SQL, "payload", "the audit never reads payloads")
	}
	require.Contains(t, asked[0].SQL, "MD5(CONCAT(record_key, ':', CAST(CAST(latest AS INT64) AS STRING)))", "the hash covers key and latest state")
	require.Contains(t, asked[0].SQL, "BIT_XOR(")
	require.Equal(t, []string{"0a", "ff"}, asked[1].Params["buckets"].Values)
	require.Equal(t, []string{"k1"}, asked[1].Params["keys"].Values)
	require.True(t, strings.Contains(asked[1].SQL, "record_key IN UNNEST(@keys)"))
}
