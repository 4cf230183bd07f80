package terraform_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/stretchr/testify/require"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
)

// iamFunctions are the terraform functions the grants' expressions use.
var iamFunctions = func() map[string]function.Function {
	f := map[string]function.Function{
		"toset": function.New(&function.Spec{
			Params: []function.Parameter{{Name: "v", Type: cty.DynamicPseudoType}},
			Type: func(args []cty.Value) (cty.Type, error) {
				t := args[0].Type()
				switch {
				case t.IsTupleType() && len(t.TupleElementTypes()) == 0, t.IsListType() && args[0].LengthInt() == 0:
					return cty.Set(cty.String), nil
				case t.IsTupleType():
					return cty.Set(t.TupleElementTypes()[0]), nil
				case t.IsListType() || t.IsSetType():
					return cty.Set(t.ElementType()), nil
				}
				return cty.NilType, fmt.Errorf("toset of %s", t.FriendlyName())
			},
			Impl: func(args []cty.Value, ret cty.Type) (cty.Value, error) { return convert.Convert(args[0], ret) },
		}),
		"setproduct": stdlib.SetProductFunc, "keys": stdlib.KeysFunc, "values": stdlib.ValuesFunc, "coalesce": stdlib.CoalesceFunc,
		"split": stdlib.SplitFunc, "trimsuffix": stdlib.TrimSuffixFunc, "lookup": stdlib.LookupFunc, "distinct": stdlib.DistinctFunc,
		"sort": stdlib.SortFunc, "merge": stdlib.MergeFunc, "flatten": stdlib.FlattenFunc, "format": stdlib.FormatFunc,
		"replace": stdlib.ReplaceFunc, "basename": function.New(&function.Spec{
			Params: []function.Parameter{{Name: "p", Type: cty.String}}, Type: function.StaticReturnType(cty.String),
			Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
				return cty.StringVal(filepath.Base(args[0].AsString())), nil
			},
		}),
	}
	for k, v := range tfFunctions {
		f[k] = v
	}
	return f
}()

// grant is one IAM member binding as terraform would create it.
type grant struct{ resource, role, member string }

// moduleGrants evaluates every *_iam_member resource of a module, each
// instance of its count or for_each, with the given variables and the
// resources the grants name mocked as the provider would fill them in.
func moduleGrants(t *testing.T, m *tfModule, vars map[string]cty.Value, mocks map[string]cty.Value) []grant {
	t.Helper()
	for name, b := range m.variables {
		if _, set := vars[name]; set {
			continue
		}
		if d, ok := b.Body.Attributes["default"]; ok {
			v, diags := d.Expr.Value(nil)
			require.False(t, diags.HasErrors(), "var.%s: %s", name, diags)
			vars[name] = v
		}
	}
	ctx := &hcl.EvalContext{Functions: iamFunctions, Variables: map[string]cty.Value{"var": cty.ObjectVal(vars)}}
	for k, v := range mocks {
		ctx.Variables[k] = v
	}
	evalLocals(m, ctx)
	var out []grant
	for key, b := range m.resources {
		if !strings.HasSuffix(strings.SplitN(key, ".", 2)[0], "_iam_member") {
			continue
		}
		instances := []map[string]cty.Value{nil}
		if c, ok := b.Body.Attributes["count"]; ok {
			n, diags := c.Expr.Value(ctx)
			require.False(t, diags.HasErrors(), "%s count: %s", key, diags)
			if k, _ := n.AsBigFloat().Int64(); k == 0 {
				instances = nil
			}
		}
		if fe, ok := b.Body.Attributes["for_each"]; ok {
			v, diags := fe.Expr.Value(ctx)
			require.False(t, diags.HasErrors(), "%s for_each: %s", key, diags)
			instances = nil
			if v.Type().IsSetType() {
				for _, e := range v.AsValueSlice() {
					instances = append(instances, map[string]cty.Value{"key": e, "value": e})
				}
			} else {
				for k, e := range v.AsValueMap() {
					instances = append(instances, map[string]cty.Value{"key": cty.StringVal(k), "value": e})
				}
			}
		}
		for _, each := range instances {
			ictx := ctx.NewChild()
			ictx.Variables = map[string]cty.Value{}
			if each != nil {
				ictx.Variables["each"] = cty.ObjectVal(each)
			}
			eval := func(name string) string {
				v, diags := b.Body.Attributes[name].Expr.Value(ictx)
				require.False(t, diags.HasErrors(), "%s.%s: %s", key, name, diags)
				return v.AsString()
			}
			out = append(out, grant{resource: key, role: eval("role"), member: eval("member")})
		}
	}
	return out
}

// account mocks a google_service_account as the provider fills it in.
func account(id string) cty.Value {
	email := id + "@acme.iam.gserviceaccount.com"
	return cty.ObjectVal(map[string]cty.Value{"email": cty.StringVal(email), "name": cty.StringVal("projects/acme/serviceAccounts/" + email),
		"id": cty.StringVal("projects/acme/serviceAccounts/" + email)})
}

// TestTerraformEachRoleGoesToItsMember evaluates every IAM grant of the
// deployment (the root module and each workspace's module, every instance
// of its for_each or count, with everything switched on: the services
// deployed, the invoker exposure, a scheduled audit, workspaces in other
// projects) and holds each member to exactly the roles its work needs,
// each on the kind of resource it needs it on. A role moved to another
// member (the verifier given dataEditor, say) fails here.
func TestTerraformEachRoleGoesToItsMember(t *testing.T) {
	t.Parallel()
	root := parseModule(t, ".")
	child := parseModule(t, "modules/workspace")
	digest := "@sha256:" + strings.Repeat("a", 64)
	workspace := func(org, sub, instance, pubsub, bq string) cty.Value {
		return cty.ObjectVal(map[string]cty.Value{
			"organization_id": cty.StringVal(org), "runtime_subject": cty.StringVal(sub),
			"database":       cty.ObjectVal(map[string]cty.Value{"instance": cty.StringVal(instance), "name": cty.StringVal("db"), "private_ip": cty.True}),
			"pubsub_project": cty.StringVal(pubsub), "topic": cty.NullVal(cty.String), "bigquery_project": cty.StringVal(bq),
			"dataset": cty.StringVal("ontology_internal"), "views_dataset": cty.StringVal("ontology"), "table": cty.StringVal("events"),
			"bigquery_location": cty.StringVal("EU"),
		})
	}
	vars := map[string]cty.Value{
		"project": cty.StringVal("acme"), "region": cty.StringVal("europe-west1"),
		"functions_image": cty.StringVal("europe-west1-docker.pkg.dev/acme/replication/functions" + digest),
		"job_image":       cty.StringVal("europe-west1-docker.pkg.dev/acme/replication/job" + digest),
		"identity": cty.ObjectVal(map[string]cty.Value{"issuer": cty.StringVal("https://i"), "audience": cty.StringVal("a"),
			"jwks_url": cty.StringVal("https://i/jwks"), "token_type": cty.NullVal(cty.String), "organization_claim": cty.NullVal(cty.String)}),
		"workspaces": cty.ObjectVal(map[string]cty.Value{
			"w1": workspace("o1", "s1", "sql-one:europe-west1:db", "ps-one", "bq-one"),
			"w2": workspace("o2", "s2", "sql-two:europe-west1:db", "acme", "acme"),
		}),
		"drain_exposure": cty.StringVal("invoker"), "drain_invokers": cty.ListVal([]cty.Value{cty.StringVal("serviceAccount:gateway@platform.iam.gserviceaccount.com")}),
		"audit_schedule": cty.StringVal("0 3 * * *"), "vpc_network": cty.StringVal("n"), "vpc_subnetwork": cty.StringVal("s"),
	}
	components := map[string]cty.Value{}
	for _, c := range []string{"drain", "verify", "job"} {
		components[c] = account("replication-" + c)
	}
	named := func(name string) cty.Value {
		return cty.ObjectVal(map[string]cty.Value{"name": cty.StringVal(name), "id": cty.StringVal(name)})
	}
	mocks := map[string]cty.Value{
		"google_service_account": cty.ObjectVal(map[string]cty.Value{"component": cty.ObjectVal(components),
			"scheduler": account("replication-scheduler"), "build": account("replication-build")}),
		"google_project_iam_custom_role": cty.ObjectVal(map[string]cty.Value{"views": cty.ObjectVal(map[string]cty.Value{
			"bq-one": named("projects/bq-one/roles/replicationViews"), "acme": named("projects/acme/roles/replicationViews")})}),
	}
	grants := moduleGrants(t, root, vars, mocks)

	// Each workspace's module, with the arguments the root passes it.
	rootEval := &hcl.EvalContext{Functions: iamFunctions, Variables: map[string]cty.Value{"var": cty.ObjectVal(vars)}}
	for k, v := range mocks {
		rootEval.Variables[k] = v
	}
	evalLocals(root, rootEval)
	call := root.modules["workspace"]
	for id, ws := range vars["workspaces"].AsValueMap() {
		ectx := rootEval.NewChild()
		ectx.Variables = map[string]cty.Value{"each": cty.ObjectVal(map[string]cty.Value{"key": cty.StringVal(id), "value": ws})}
		args := map[string]cty.Value{}
		for name, a := range call.Body.Attributes {
			if name == "source" || name == "for_each" || name == "depends_on" {
				continue
			}
			v, diags := a.Expr.Value(ectx)
			require.False(t, diags.HasErrors(), "module.workspace.%s: %s", name, diags)
			args[name] = v
		}
		agent := cty.ObjectVal(map[string]cty.Value{"pubsub": cty.ObjectVal(map[string]cty.Value{"number": cty.StringVal("123")})})
		grants = append(grants, moduleGrants(t, child, args, map[string]cty.Value{"data": cty.ObjectVal(map[string]cty.Value{"google_project": agent})})...)
	}

	got := map[string][]string{} // member → "role on <resource type>"
	for _, g := range grants {
		member := strings.TrimSuffix(strings.TrimPrefix(g.member, "serviceAccount:"), ".iam.gserviceaccount.com")
		on := strings.TrimSuffix(strings.TrimPrefix(strings.SplitN(g.resource, ".", 2)[0], "google_"), "_iam_member")
		role := strings.TrimPrefix(g.role, "roles/")
		if strings.HasSuffix(role, "/roles/replicationViews") {
			role = "replicationViews"
		}
		if g.resource == "google_bigquery_dataset_iam_member.job" {
			on = "views dataset"
		}
		entry := role + " on " + on
		if !slices.Contains(got[member], entry) {
			got[member] = append(got[member], entry)
		}
	}
	for m := range got {
		sort.Strings(got[m])
	}
	want := map[string][]string{
		"replication-drain@acme": {"cloudsql.client on project", "cloudsql.instanceUser on project", "monitoring.metricWriter on project",
			"pubsub.publisher on pubsub_topic", "secretmanager.secretAccessor on secret_manager_secret"},
		"replication-verify@acme": {"bigquery.dataViewer on bigquery_dataset", "bigquery.jobUser on project", "cloudsql.client on project",
			"cloudsql.instanceUser on project", "monitoring.metricWriter on project", "pubsub.publisher on pubsub_topic",
			"secretmanager.secretAccessor on secret_manager_secret"},
		"replication-job@acme": {"bigquery.dataViewer on bigquery_dataset", "bigquery.jobUser on project", "cloudsql.client on project",
			"cloudsql.instanceUser on project", "monitoring.metricWriter on project", "pubsub.publisher on pubsub_topic",
			"pubsub.subscriber on pubsub_subscription", "replicationViews on views dataset", "secretmanager.secretAccessor on secret_manager_secret"},
		"replication-scheduler@acme": {"run.invoker on cloud_run_v2_job", "run.invoker on cloud_run_v2_service"},
		"replication-build@acme": {"artifactregistry.writer on artifact_registry_repository", "iam.serviceAccountUser on service_account",
			"logging.logWriter on project", "run.developer on project", "storage.objectUser on storage_bucket"},
		"service-123@gcp-sa-pubsub": {"bigquery.dataEditor on bigquery_dataset", "bigquery.metadataViewer on bigquery_dataset",
			"pubsub.publisher on pubsub_topic", "pubsub.subscriber on pubsub_subscription"},
		"gateway@platform": {"run.invoker on cloud_run_v2_service"},
	}
	require.Equal(t, want, got)
}
