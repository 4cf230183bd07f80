package warehouse_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

func TestPresent(t *testing.T) {
	t.Parallel()
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprintf("%064x", i)
	}
	var last bqserver.Query
	cases := []struct {
		name         string
		pageSize     int
		landed       []string
		partitioning string
		wantSince    bool
	}{
		{"all present in one answer", 0, ids, registry.PartitioningIngestionTime, true},
		{"paged answer", 300, ids[:700], registry.PartitioningNone, false},
		{"none present (empty answer, then getQueryResults)", 0, nil, registry.PartitioningIngestionTime, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := bqserver.New(func(_ context.Context, q bqserver.Query) (bqserver.Result, error) {
				last = q
				asked := map[string]bool{}
				for _, id := range q.Params["ids"].Values {
					asked[id] = true
				}
				var out []string
				for _, id := range c.landed {
					if asked[id] {
						out = append(out, id)
					}
				}
				return bqserver.Strings("event_id", out), nil
			})
			srv.PageSize = c.pageSize
			hs := httptest.NewServer(srv)
			defer hs.Close()
			wh, err := warehouse.NewBigQuery(warehouse.Config{})
			require.NoError(t, err)
			defer wh.Close()
			table := registry.BigQuery{Project: "p1", Dataset: "ontology_internal", Table: "events",
				Location: "EU", Endpoint: hs.URL, Partitioning: c.partitioning}
			accepted := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
			got, err := wh.Present(context.Background(), table, []warehouse.Lookup{
				{Generation: "gen-1", EventIDs: ids[:600], AcceptedSince: accepted.Add(time.Hour)},
				{Generation: "gen-2", EventIDs: ids[600:], AcceptedSince: accepted},
			})
			require.NoError(t, err)
			require.ElementsMatch(t, c.landed, got)
			require.EqualValues(t, 1, srv.Queries(), "one query for both generations")
			require.Equal(t, "ARRAY", last.Params["ids"].Type)
			require.Equal(t, "STRING", last.Params["ids"].ArrayType)
			require.Equal(t, ids, last.Params["ids"].Values)
			require.Equal(t, []string{"gen-1", "gen-2"}, last.Params["generations"].Values)
			require.Equal(t, "EU", last.Location)
			want := "SELECT event_id FROM `p1.ontology_internal.events`\nWHERE generation IN UNNEST(@generations) AND event_id IN UNNEST(@ids)"
			if c.wantSince {
				want += "\n  AND (_PARTITIONTIME IS NULL OR _PARTITIONTIME >= TIMESTAMP_TRUNC(@since, DAY))"
			}
			require.Equal(t, want, last.SQL, "the whole statement")
			if c.wantSince {
				require.Equal(t, "TIMESTAMP", last.Params["since"].Type)
				require.True(t, strings.HasPrefix(last.Params["since"].Value, "2026-11-29 12:00:00"), "a day before the oldest acceptance: %s", last.Params["since"].Value)
			}
		})
	}
}

func TestPresentFailure(t *testing.T) {
	t.Parallel()
	hs := httptest.NewServer(bqserver.New(func(context.Context, bqserver.Query) (bqserver.Result, error) {
		return bqserver.Result{}, &bqserver.Error{Status: 400, Reason: "invalidQuery", Message: "no such table"}
	}))
	defer hs.Close()
	wh, err := warehouse.NewBigQuery(warehouse.Config{LookupTimeout: 2 * time.Second})
	require.NoError(t, err)
	defer wh.Close()
	table := registry.BigQuery{Project: "p1", Dataset: "d", Table: "events", Endpoint: hs.URL}
	_, err = wh.Present(context.Background(), table, []warehouse.Lookup{{Generation: "g", EventIDs: []string{"a"}}})
	require.ErrorContains(t, err, "no such table")
	got, err := wh.Present(context.Background(), table, []warehouse.Lookup{{Generation: "g"}})
	require.NoError(t, err)
	require.Empty(t, got, "no ids, no query")
	_, err = wh.Present(context.Background(), table, []warehouse.Lookup{{Generation: "g", EventIDs: make([]string, warehouse.MaxLookupIDs+1)}})
	require.ErrorContains(t, err, "more than one query takes")
}
