package warehouse_test

import (
	"context"
	"flag"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

var update = flag.Bool("update", false, "rewrite golden files")

func demoTarget(t *testing.T, m sdkfixture.Manifest, sel []sdkfixture.Selection) warehouse.ViewTarget {
	t.Helper()
	tg, err := sdkfixture.StaticTarget(m, sel)
	require.NoError(t, err)
	return delivery.ViewsTarget(tg)
}

func TestViewsGolden(t *testing.T) {
	t.Parallel()
	// Every property storage type, a one-relationship and a many-relationship;
	// customer.email is not selected.
	sel := sdkfixture.Demo.FullSelection()
	sel[0].Fields = without(sel[0].Fields, "email")
	views, err := warehouse.Views("p1", "`p1.ontology_internal.events`", demoTarget(t, sdkfixture.Demo, sel))
	require.NoError(t, err)
	var b strings.Builder
	for _, v := range views {
		b.WriteString("-- " + v.Name + "\n" + v.Query + "\n\n")
	}
	golden := "testdata/views.golden.sql"
	if *update {
		require.NoError(t, os.WriteFile(golden, []byte(b.String()), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	require.Equal(t, string(want), b.String())
	require.Equal(t, []string{"customer", "product", "order", "order_products"}, names(views))
}

func without(s []string, drop string) []string {
	var out []string
	for _, v := range s {
		if v != drop {
			out = append(out, v)
		}
	}
	return out
}

func names(views []warehouse.View) []string {
	var out []string
	for _, v := range views {
		out = append(out, v.Name)
	}
	return out
}

func TestViewsErrors(t *testing.T) {
	t.Parallel()
	m := sdkfixture.Demo
	m.Entities = append(append([]sdkfixture.Entity{}, m.Entities...), sdkfixture.Entity{ID: "ent_op", Name: "Order_Products"})
	sel := append(sdkfixture.Demo.FullSelection(), sdkfixture.Selection{EntityID: "ent_op", Fields: []string{"id"}})
	_, err := warehouse.Views("p1", "`p1.d.events`", demoTarget(t, m, sel))
	require.ErrorIs(t, err, warehouse.ErrViewCollision)

	_, err = warehouse.Views("p1; DROP", "`p1.d.events`", demoTarget(t, sdkfixture.Demo, sdkfixture.Demo.FullSelection()))
	require.ErrorContains(t, err, "invalid BigQuery replication identifier")

	bad := sdkfixture.Demo
	bad.Entities = append([]sdkfixture.Entity{}, bad.Entities...)
	bad.Entities[1] = sdkfixture.Entity{ID: "ent_product", Name: "product", Properties: []sdkfixture.Property{{Name: "ti`tle", Type: "string"}}}
	selBad := sdkfixture.Demo.FullSelection()
	selBad[1].Fields = []string{"id", "ti`tle"}
	_, err = warehouse.Views("p1", "`p1.d.events`", demoTarget(t, bad, selBad))
	require.ErrorContains(t, err, "ti`tle")

	tg := demoTarget(t, sdkfixture.Demo, []sdkfixture.Selection{{EntityID: "ent_missing", Fields: []string{"id"}}})
	_, err = warehouse.Views("p1", "`p1.d.events`", tg)
	require.ErrorContains(t, err, "ent_missing")
}

func TestLiteralEscaping(t *testing.T) {
	t.Parallel()
	tg := demoTarget(t, sdkfixture.Demo, sdkfixture.Demo.FullSelection()[:1])
	tg.SourceID = `a'b\c`
	views, err := warehouse.Views("p1", "`p1.d.events`", tg)
	require.NoError(t, err)
	require.Contains(t, views[0].Query, `source_id = 'a\'b\\c'`)
}

func TestCreateViewsThroughTheClient(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []bqserver.Query
	srv := httptest.NewServer(bqserver.New(func(_ context.Context, q bqserver.Query) (bqserver.Result, error) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, q)
		return bqserver.Result{}, nil
	}))
	defer srv.Close()
	wh, err := warehouse.NewBigQuery(warehouse.Config{})
	require.NoError(t, err)
	defer wh.Close()
	ws := registry.Workspace{ID: "w1", BigQuery: registry.BigQuery{Project: "p1", Dataset: "ontology_internal", Table: "events", Location: "EU", Endpoint: srv.URL}}
	created, err := wh.CreateViews(context.Background(), ws, demoTarget(t, sdkfixture.Demo, sdkfixture.Demo.FullSelection()))
	require.NoError(t, err)
	require.Equal(t, []string{"p1.ontology_internal.customer", "p1.ontology_internal.product", "p1.ontology_internal.order", "p1.ontology_internal.order_products"}, created)
	require.Len(t, got, 4)
	require.True(t, strings.HasPrefix(got[0].SQL, "CREATE OR REPLACE VIEW `p1.ontology_internal.customer` AS\nSELECT"))
	require.Contains(t, got[3].SQL, "FROM `p1.ontology_internal.events`")
	require.Equal(t, "EU", got[0].Location)

	// With a views dataset of their own, the views go there and still read
	// the events table where it is.
	got = nil
	ws.BigQuery.ViewsDataset = "ontology"
	created, err = wh.CreateViews(context.Background(), ws, demoTarget(t, sdkfixture.Demo, sdkfixture.Demo.FullSelection()))
	require.NoError(t, err)
	require.Equal(t, "p1.ontology.customer", created[0])
	require.True(t, strings.HasPrefix(got[0].SQL, "CREATE OR REPLACE VIEW `p1.ontology.customer` AS\nSELECT"))
	require.Contains(t, got[0].SQL, "FROM `p1.ontology_internal.events`")
}

// seedLiteral and seedIdentifier are the seed's literal and identifier
// (seed 001, replication/bigquery.js).
func seedLiteral(v string) string {
	return "'" + strings.ReplaceAll(strings.ReplaceAll(v, `\`, `\\`), "'", `\'`) + "'"
}

func seedIdentifier(v string) string {
	if !regexp.MustCompile(`^[A-Za-z0-9_-]+$`).MatchString(v) {
		panic("Invalid BigQuery replication identifier.")
	}
	return "`" + v + "`"
}

// seedViews is the seed's replicationViews, written again from its text
// line for line (the fixture's Fields are the SDK's queryFields): the
// reference the product's views are compared with, independent of the
// product's code. The seed reads `<project>.ontology_internal.events`.
func seedViews(project, generation, source string, m sdkfixture.Manifest, selection []sdkfixture.Selection) []warehouse.View {
	seedIdentifier(project)
	latest := func(entity, kind, columns string) string {
		return `SELECT ` + columns + ` FROM (
      SELECT *, ROW_NUMBER() OVER (PARTITION BY record_key ORDER BY revision DESC, event_id DESC) AS position
      FROM ` + "`" + project + `.ontology_internal.events` + "`" + `
      WHERE generation = ` + seedLiteral(generation) + ` AND source_id = ` + seedLiteral(source) + `
        AND entity_id = ` + seedLiteral(entity) + ` AND record_kind = ` + seedLiteral(kind) + `
    ) WHERE position = 1 AND NOT deleted`
	}
	types := map[string]string{"integer": "INT64", "number": "FLOAT64", "boolean": "BOOL", "date": "DATE", "timestamp": "TIMESTAMP"}
	var result []warehouse.View
	for _, sel := range selection {
		var entity sdkfixture.Entity
		for _, e := range m.Entities {
			if e.ID == sel.EntityID {
				entity = e
			}
		}
		var columns []string
		for _, f := range entity.Fields() {
			if f.Name != "id" && !slices.Contains(sel.Fields, f.Name) {
				continue
			}
			path := seedLiteral("$." + f.Name)
			value := "JSON_VALUE(payload, " + path + ")"
			if f.Storage == "json" {
				value = "JSON_QUERY(payload, " + path + ")"
			}
			if typ, ok := types[f.Storage]; ok {
				value = "SAFE_CAST(" + value + " AS " + typ + ")"
			}
			columns = append(columns, value+" AS "+seedIdentifier(f.Name))
		}
		result = append(result, warehouse.View{Name: entity.Name, Query: latest(entity.ID, "entity", strings.Join(columns, ", "))})
		for _, r := range sel.Relationships {
			result = append(result, warehouse.View{Name: entity.Name + "_" + r,
				Query: latest(entity.ID, "edge:"+r, "JSON_VALUE(payload, '$.source_id') AS source_id, JSON_VALUE(payload, '$.target_id') AS target_id")})
		}
	}
	return result
}

// TestViewsAreTheSeeds: for selections from everything to ids only, with
// and without relationships, and a source id that needs escaping, the
// product's views are the seed's, name for name and byte for byte.
func TestViewsAreTheSeeds(t *testing.T) {
	t.Parallel()
	full := sdkfixture.Demo.FullSelection()
	idsOnly := slices.Clone(full)
	for i := range idsOnly {
		idsOnly[i] = sdkfixture.Selection{EntityID: idsOnly[i].EntityID, Fields: []string{"id"}}
	}
	noEmail := slices.Clone(full)
	noEmail[0].Fields = without(noEmail[0].Fields, "email")
	for _, tc := range []struct {
		name      string
		selection []sdkfixture.Selection
		source    string
	}{
		{"everything", full, ""},
		{"customer.email excluded", noEmail, ""},
		{"ids only, no relationships", idsOnly, ""},
		{"one entity", full[1:2], ""},
		{"a source id to escape", full, `a'b\c`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tg := demoTarget(t, sdkfixture.Demo, tc.selection)
			if tc.source != "" {
				tg.SourceID = tc.source
			}
			got, err := warehouse.Views("p1", "`p1.ontology_internal.events`", tg)
			require.NoError(t, err)
			require.Equal(t, seedViews("p1", tg.Generation, tg.SourceID, sdkfixture.Demo, tc.selection), got)
		})
	}
}
