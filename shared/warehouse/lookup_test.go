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
			ws := registry.Workspace{BigQuery: registry.BigQuery{Project: "p1", Dataset: "ontology_internal", Table: "events",
				Location: "EU", Endpoint: hs.URL, Partitioning: c.partitioning}}
			got, err := wh.Present(context.Background(), ws, "gen-1", ids, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
			require.NoError(t, err)
			require.ElementsMatch(t, c.landed, got)
			require.EqualValues(t, 1, srv.Queries(), "one query per lookup")
			require.Equal(t, "ARRAY", last.Params["ids"].Type)
			require.Equal(t, "STRING", last.Params["ids"].ArrayType)
			require.Len(t, last.Params["ids"].Values, 1000)
			require.Equal(t, "gen-1", last.Params["generation"].Value)
			require.Equal(t, "EU", last.Location)
			require.Contains(t, last.SQL, "SELECT event_id FROM `p1.ontology_internal.events`")
			require.Contains(t, last.SQL, "event_id IN UNNEST(@ids)")
			require.NotContains(t, last.SQL, ids[0], "ids are parameters, never SQL")
			require.Equal(t, c.wantSince, strings.Contains(last.SQL, "_PARTITIONTIME >= TIMESTAMP_TRUNC(@since, DAY)"))
			if c.wantSince {
				require.Equal(t, "TIMESTAMP", last.Params["since"].Type)
				require.True(t, strings.HasPrefix(last.Params["since"].Value, "2026-11-29 12:00:00"), last.Params["since"].Value)
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
	ws := registry.Workspace{BigQuery: registry.BigQuery{Project: "p1", Dataset: "d", Table: "events", Endpoint: hs.URL}}
	_, err = wh.Present(context.Background(), ws, "g", []string{"a"}, time.Time{})
	require.ErrorContains(t, err, "no such table")
	got, err := wh.Present(context.Background(), ws, "g", nil, time.Time{})
	require.NoError(t, err)
	require.Empty(t, got, "no ids, no query")
}
