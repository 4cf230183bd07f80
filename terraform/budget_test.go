package terraform_test

import (
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/stretchr/testify/require"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"

	"github.com/segmentstream/ontology-replication/shared/database"
)

// TestTerraformInstanceBudgetIsTheCodes: terraform's worst case of
// connections on one Cloud SQL instance, evaluated from the HCL for shared
// instances of 1 to 40 workspace databases, is each component's most
// processes × min(its per-server cap, its pool size × the databases) — the
// bound the code enforces (database.Config.ServerMaxConns, a pool per
// workspace) — and each component is given the cap the budget counts, as
// DATABASE_SERVER_MAX_CONNS.
func TestTerraformInstanceBudgetIsTheCodes(t *testing.T) {
	t.Parallel()
	m := parseModule(t, ".")
	components := map[string]string{ // component → its service or job
		"drain": "google_cloud_run_v2_service.drain", "verify": "google_cloud_run_v2_service.verify", "job": "google_cloud_run_v2_job.replication",
	}
	capVar := map[string]string{"drain": "drain_server_max_connections", "verify": "verifier_server_max_connections", "job": "job_server_max_connections"}
	for c, key := range components {
		env := envOf(t, m.resources[key])
		e, ok := env["DATABASE_SERVER_MAX_CONNS"]
		require.True(t, ok, "%s is given its per-server cap", key)
		require.Contains(t, string(e.Range().SliceBytes(m.source[e.Range().Filename])), `local.server_max_conns["`+c+`"]`, key)
	}
	capsExpr := m.locals["server_max_conns"].Expr
	require.NotNil(t, capsExpr)
	caps := string(capsExpr.Range().SliceBytes(m.source[capsExpr.Range().Filename]))
	for c, v := range capVar {
		require.Contains(t, caps, c+" = var."+v)
	}

	funcs := map[string]function.Function{"min": stdlib.MinFunc, "length": stdlib.LengthFunc, "lookup": stdlib.LookupFunc}
	for _, c := range []struct {
		databases                   int
		drainInstances, jobTasks    int
		drainPool, verifyPool, job  int
		drainCap, verifyCap, jobCap int
	}{
		{1, 10, 1, 2, 2, 4, 4, 8, 8},
		{3, 10, 1, 2, 2, 4, 4, 8, 8},
		{40, 10, 2, 2, 2, 4, 4, 8, 8},
		{40, 20, 3, 3, 1, 6, 2, 5, 7},
	} {
		members := make([]cty.Value, c.databases)
		for i := range members {
			members[i] = cty.ObjectVal(map[string]cty.Value{"project": cty.StringVal("acme"), "name": cty.StringVal("shared")})
		}
		num := func(n int) cty.Value { return cty.NumberIntVal(int64(n)) }
		ctx := &hcl.EvalContext{Functions: funcs, Variables: map[string]cty.Value{
			"local": cty.ObjectVal(map[string]cty.Value{"sql_instances": cty.ObjectVal(map[string]cty.Value{"acme:r:shared": cty.TupleVal(members)})}),
			"var": cty.ObjectVal(map[string]cty.Value{
				"drain_max_instances": num(c.drainInstances), "job_tasks": num(c.jobTasks),
				"drain_pool_size": num(c.drainPool), "verifier_pool_size": num(c.verifyPool), "job_pool_size": num(c.job),
				"drain_server_max_connections": num(c.drainCap), "verifier_server_max_connections": num(c.verifyCap), "job_server_max_connections": num(c.jobCap),
			}),
		}}
		got, diags := m.locals["instance_connections"].Expr.Value(ctx)
		require.False(t, diags.HasErrors(), diags.Error())
		n, _ := got.GetAttr("acme:r:shared").AsBigFloat().Int64()
		// The verifier runs as one instance (services.tf).
		want := c.drainInstances*min(c.drainCap, c.drainPool*c.databases) + 1*min(c.verifyCap, c.verifyPool*c.databases) + c.jobTasks*min(c.jobCap, c.job*c.databases)
		require.EqualValues(t, want, n, "%+v", c)
	}
	// Each process's pool per workspace, in the registry the component
	// reads (max_conns), is the pool size the budget counts.
	poolVars := map[string]int{"drain_pool_size": 2, "verifier_pool_size": 3, "job_pool_size": 5}
	vars := map[string]cty.Value{}
	for k, v := range poolVars {
		vars[k] = cty.NumberIntVal(int64(v))
	}
	pools, diags := m.locals["pool_size"].Expr.Value(&hcl.EvalContext{Variables: map[string]cty.Value{"var": cty.ObjectVal(vars)}})
	require.False(t, diags.HasErrors(), diags.Error())
	for c, v := range map[string]string{"drain": "drain_pool_size", "verify": "verifier_pool_size", "job": "job_pool_size"} {
		n, _ := pools.GetAttr(c).AsBigFloat().Int64()
		require.EqualValues(t, poolVars[v], n, "the %s pool the budget counts", c)
	}
	registryExpr := m.locals["registry"].Expr
	registrySource := string(registryExpr.Range().SliceBytes(m.source[registryExpr.Range().Filename]))
	require.Regexp(t, `max_conns\s*=\s*local\.pool_size\[c\]\s*\n`, registrySource, "the registry's max_conns is the budget's pool size")
	require.Equal(t, 1, strings.Count(registrySource, "max_conns"))

	for name, def := range map[string]int{"drain_server_max_connections": 4, "verifier_server_max_connections": database.DefaultServerMaxConns, "job_server_max_connections": database.DefaultServerMaxConns} {
		v, diags := m.variables[name].Body.Attributes["default"].Expr.Value(nil)
		require.False(t, diags.HasErrors())
		got, _ := v.AsBigFloat().Int64()
		require.EqualValues(t, def, got, name)
	}
}
