package terraform_test

import (
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/stretchr/testify/require"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
)

// TestTerraformPrivateIPNeedsANetwork evaluates the network precondition
// as terraform would: a workspace on its database's private IP (the
// default) with no vpc_network is refused, naming it; with a network, or
// with every workspace on public IPs, it passes. Every component waits for
// the check.
func TestTerraformPrivateIPNeedsANetwork(t *testing.T) {
	t.Parallel()
	m := parseModule(t, ".")
	check := m.resources["terraform_data.network"]
	require.NotNil(t, check)
	var cond, msg hclsyntax.Expression
	for _, b := range check.Body.Blocks {
		for _, p := range b.Body.Blocks {
			if p.Type == "precondition" {
				cond, msg = p.Body.Attributes["condition"].Expr, p.Body.Attributes["error_message"].Expr
			}
		}
	}
	require.NotNil(t, cond)
	funcs := map[string]function.Function{"length": stdlib.LengthFunc, "sort": stdlib.SortFunc, "join": stdlib.JoinFunc}
	for _, c := range []struct {
		name      string
		private   map[string]bool
		network   string
		ok        bool
		mentioned string
	}{
		{"private, no network", map[string]bool{"w1": true, "w2": false}, "", false, "w1"},
		{"private, a network", map[string]bool{"w1": true}, "projects/acme/global/networks/default", true, ""},
		{"public only", map[string]bool{"w1": false, "w2": false}, "", true, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			workspaces := map[string]cty.Value{}
			for id, private := range c.private {
				workspaces[id] = cty.ObjectVal(map[string]cty.Value{"database": cty.ObjectVal(map[string]cty.Value{"private_ip": cty.BoolVal(private)})})
			}
			vars := map[string]cty.Value{"workspaces": cty.ObjectVal(workspaces), "vpc_network": cty.StringVal(c.network)}
			ctx := &hcl.EvalContext{Functions: funcs, Variables: map[string]cty.Value{"var": cty.ObjectVal(vars)}}
			private, diags := m.locals["private_ip_workspaces"].Expr.Value(ctx)
			require.False(t, diags.HasErrors(), diags.Error())
			ctx.Variables["local"] = cty.ObjectVal(map[string]cty.Value{"private_ip_workspaces": private})
			ok, diags := cond.Value(ctx)
			require.False(t, diags.HasErrors(), diags.Error())
			require.Equal(t, c.ok, ok.True())
			if !c.ok {
				text, diags := msg.Value(ctx)
				require.False(t, diags.HasErrors(), diags.Error())
				require.Contains(t, text.AsString(), "Workspaces "+c.mentioned+" reach")
				require.Contains(t, text.AsString(), "set vpc_network")
			}
		})
	}
	for _, key := range []string{"google_cloud_run_v2_service.drain", "google_cloud_run_v2_service.verify", "google_cloud_run_v2_job.replication"} {
		deps := m.resources[key].Body.Attributes["depends_on"]
		require.NotNil(t, deps, key)
		require.Contains(t, string(deps.Expr.Range().SliceBytes(m.source[deps.Expr.Range().Filename])), "terraform_data.network", key)
	}
}
