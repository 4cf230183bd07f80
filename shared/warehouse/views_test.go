package warehouse_test

import (
	"context"
	"flag"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

var update = flag.Bool("update", false, "rewrite golden files")

func demoTarget(t *testing.T, m sdkfixture.Manifest, sel []sdkfixture.Selection) store.Target {
	t.Helper()
	tg, err := sdkfixture.StaticTarget(m, sel)
	require.NoError(t, err)
	return tg
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
}
