package terraform_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/tryfunc"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/stretchr/testify/require"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
)

// TestTerraformAlertsPageOrTicket: every alert policy has a severity,
// CRITICAL (a page) or WARNING (a ticket), and notifies that severity's
// channels; its documentation has a subject, names the workspace label
// when its condition is per workspace (so that the page says which) and
// says what to run.
func TestTerraformAlertsPageOrTicket(t *testing.T) {
	t.Parallel()
	e := newMonitoringEval(t)
	pages := map[string]bool{}
	n := 0
	for key, b := range e.m.resources {
		name, ok := strings.CutPrefix(key, "google_monitoring_alert_policy.")
		if !ok {
			continue
		}
		n++
		t.Run(name, func(t *testing.T) {
			src := func(a *hclsyntax.Attribute) string {
				return string(a.Expr.Range().SliceBytes(e.m.source[a.Expr.Range().Filename]))
			}
			sev, ok := b.Body.Attributes["severity"]
			require.True(t, ok, "no severity")
			severity := src(sev)
			channels := src(b.Body.Attributes["notification_channels"])
			switch severity {
			case `"CRITICAL"`, `"WARNING"`:
				require.Equal(t, `local.severity_channels[`+severity+`]`, channels, "notifies its severity's channels")
				pages[name] = severity == `"CRITICAL"`
			case "each.value.severity":
				require.Equal(t, "local.severity_channels[each.value.severity]", channels)
			default:
				t.Fatalf("severity %s", severity)
			}
			var doc *hclsyntax.Block
			for _, blk := range b.Body.Blocks {
				if blk.Type == "documentation" {
					doc = blk
				}
			}
			require.NotNil(t, doc, "no documentation")
			require.Contains(t, doc.Body.Attributes, "subject")
			content := src(doc.Body.Attributes["content"])
			if fe, ok := b.Body.Attributes["for_each"]; ok && src(fe) == "local.lag_alerts" {
				lags, diags := e.m.locals["lag_alerts"].Expr.Value(e.ctx)
				require.False(t, diags.HasErrors(), diags.Error())
				for k, v := range lags.AsValueMap() {
					require.Contains(t, v.GetAttr("doc").AsString(), "${metric.label.workspace}", k)
					require.Contains(t, v.GetAttr("doc").AsString(), "gcloud run jobs execute", k)
				}
				return
			}
			perWorkspace := false
			walk(b.Body, nil, func(n string, expr hclsyntax.Expression, _ []string) {
				text := string(expr.Range().SliceBytes(e.m.source[expr.Range().Filename]))
				perWorkspace = perWorkspace || n == "group_by_fields" && strings.Contains(text, "metric.label.workspace") ||
					n == "query" && text == "local.drain_failing"
			})
			if perWorkspace {
				require.Contains(t, content, "local.workspace", "a per-workspace alert names the workspace")
			}
			require.Regexp(t, "job_command|gcloud|SELECT|Raise", content, "says what to run")
		})
	}
	require.GreaterOrEqual(t, n, 12)
	// Each threshold fires above its bound: a reversed comparison never
	// fires (every bound here is a count, an age or a ratio to exceed).
	for key := range e.m.resources {
		if name, ok := strings.CutPrefix(key, "google_monitoring_alert_policy."); ok && name != "connections" {
			for cname, c := range e.conditions(name) {
				if c.kind == "condition_threshold" {
					require.Equal(t, "COMPARISON_GT", c.comparison, "%s %s", name, cname)
				}
			}
		}
	}
	for _, name := range []string{"lag", "bigquery_subscription", "workspace_failing", "verifier", "connections"} {
		require.True(t, pages[name], "%s pages", name)
	}
	// The drain failing is a cause (a Pub/Sub blip fires it while delivery
	// never lags): a ticket; delivery stalled, the symptom, pages.
	for _, name := range []string{"dead_letters", "bigquery_write_errors", "audit", "audit_job", "verifier_not_reaching", "drain_failures", "job_failed"} {
		require.False(t, pages[name], "%s is a ticket", name)
	}
}

// validationFunctions are the terraform functions the variables'
// validations use.
var validationFunctions = func() map[string]function.Function {
	fns := map[string]function.Function{
		"contains": stdlib.ContainsFunc, "upper": stdlib.UpperFunc, "floor": stdlib.FloorFunc, "regex": stdlib.RegexFunc,
		"trimsuffix": stdlib.TrimSuffixFunc, "can": tryfunc.CanFunc,
		"endswith": function.New(&function.Spec{
			Params: []function.Parameter{{Name: "s", Type: cty.String}, {Name: "suffix", Type: cty.String}},
			Type:   function.StaticReturnType(cty.Bool),
			Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
				return cty.BoolVal(strings.HasSuffix(args[0].AsString(), args[1].AsString())), nil
			},
		}),
		"tonumber": function.New(&function.Spec{
			Params: []function.Parameter{{Name: "v", Type: cty.DynamicPseudoType}},
			Type:   function.StaticReturnType(cty.Number),
			Impl:   func(args []cty.Value, _ cty.Type) (cty.Value, error) { return convert.Convert(args[0], cty.Number) },
		}),
	}
	return fns
}()

// TestTerraformValidatesItsVariables: a value that would crash-loop a
// service or make an alert meaningless is refused at plan time, and the
// defaults pass.
func TestTerraformValidatesItsVariables(t *testing.T) {
	t.Parallel()
	m := parseModule(t, ".")
	valid := func(t *testing.T, name string, v cty.Value) bool {
		b, ok := m.variables[name]
		require.True(t, ok, "var.%s", name)
		var conds []hcl.Expression
		for _, blk := range b.Body.Blocks {
			if blk.Type == "validation" {
				conds = append(conds, blk.Body.Attributes["condition"].Expr)
			}
		}
		require.NotEmpty(t, conds, "var.%s has no validation", name)
		ctx := &hcl.EvalContext{Functions: validationFunctions, Variables: map[string]cty.Value{"var": cty.ObjectVal(map[string]cty.Value{name: v})}}
		for _, c := range conds {
			got, diags := c.Value(ctx)
			if diags.HasErrors() || got.False() {
				return false
			}
		}
		return true
	}
	for _, tc := range []struct {
		name      string
		good, bad []cty.Value
	}{
		{"log_level", []cty.Value{cty.StringVal("INFO"), cty.StringVal("debug"), cty.StringVal("WARN")}, []cty.Value{cty.StringVal("verbose"), cty.StringVal("")}},
		{"dead_letter_max_delivery_attempts", []cty.Value{cty.NumberIntVal(5), cty.NumberIntVal(100)}, []cty.Value{cty.NumberIntVal(3), cty.NumberIntVal(101), cty.NumberFloatVal(5.5)}},
		{"slo_goal", []cty.Value{cty.NumberFloatVal(0.999)}, []cty.Value{cty.NumberFloatVal(99.9), cty.NumberIntVal(1), cty.NumberIntVal(0)}},
		{"drain_failure_ratio_alert", []cty.Value{cty.NumberFloatVal(0.1)}, []cty.Value{cty.NumberIntVal(10), cty.NumberIntVal(0)}},
		{"verify_time_budget", []cty.Value{cty.StringVal("50s"), cty.StringVal("1m"), cty.StringVal("110s")},
			[]cty.Value{cty.StringVal("2m"), cty.StringVal("50"), cty.StringVal("1h"), cty.StringVal("4s"), cty.StringVal("1m30s")}},
		{"job_max_retries", []cty.Value{cty.NumberIntVal(0), cty.NumberIntVal(3)}, []cty.Value{cty.NumberIntVal(-1), cty.NumberIntVal(11)}},
		{"set_aside_alert_minutes", []cty.Value{cty.NumberIntVal(15)}, []cty.Value{cty.NumberIntVal(10)}},
		{"connections_alert_ratio", []cty.Value{cty.NumberFloatVal(0.9)}, []cty.Value{cty.NumberIntVal(90)}},
		{"audit_result_max_hours", []cty.Value{cty.NumberIntVal(24)}, []cty.Value{cty.NumberIntVal(48), cty.NumberIntVal(0)}},
		{"iam_propagation_wait", []cty.Value{cty.StringVal("0s"), cty.StringVal("90s"), cty.StringVal("2m")},
			[]cty.Value{cty.StringVal("60"), cty.StringVal("1m30s"), cty.StringVal("a minute"), cty.StringVal("")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			def, diags := m.variables[tc.name].Body.Attributes["default"].Expr.Value(nil)
			require.False(t, diags.HasErrors())
			require.True(t, valid(t, tc.name, def), "the default %s passes", def.GoString())
			for _, v := range tc.good {
				require.True(t, valid(t, tc.name, v), "%s is refused", v.GoString())
			}
			for _, v := range tc.bad {
				require.False(t, valid(t, tc.name, v), "%s passes", v.GoString())
			}
		})
	}
}

// TestTerraformServicesCanBeDestroyed: the services and jobs take their
// deletion protection from var.deletion_protection, so that the teardown
// the README documents (false, apply, destroy) removes them.
func TestTerraformServicesCanBeDestroyed(t *testing.T) {
	t.Parallel()
	m := parseModule(t, ".")
	for _, key := range []string{"google_cloud_run_v2_service.drain", "google_cloud_run_v2_service.verify", "google_cloud_run_v2_job.replication"} {
		a, ok := m.resources[key].Body.Attributes["deletion_protection"]
		require.True(t, ok, "%s: deletion_protection is the provider's default (true)", key)
		require.Equal(t, "var.deletion_protection", string(a.Expr.Range().SliceBytes(m.source[a.Expr.Range().Filename])), key)
	}
	def, _ := m.variables["deletion_protection"].Body.Attributes["default"].Expr.Value(nil)
	require.True(t, def.True(), "protected unless the operator says otherwise")
	// The scheduled audit's job never retries.
	jobs := string(m.locals["jobs"].Expr.Range().SliceBytes(m.source[m.locals["jobs"].Expr.Range().Filename]))
	require.Contains(t, jobs, fmt.Sprintf("%q = { args = [%q], max_retries = 0 }", "replication-audit", "audit"))
}

// TestTerraformEnablesEveryAPIItUses: each resource type of the deployment
// project is served by an API that apis.tf enables (a type whose API is
// left out fails the first apply on a fresh project).
func TestTerraformEnablesEveryAPIItUses(t *testing.T) {
	t.Parallel()
	m := parseModule(t, ".")
	// toset([…]) of string literals: the literals.
	call, ok := m.locals["services"].Expr.(*hclsyntax.FunctionCallExpr)
	require.True(t, ok && call.Name == "toset", "local.services is toset([...])")
	enabled, diags := call.Args[0].Value(nil)
	require.False(t, diags.HasErrors(), diags.Error())
	apis := map[string]bool{}
	for _, v := range enabled.AsValueSlice() {
		apis[v.AsString()] = true
	}
	// The API of each resource type's prefix (the longest prefix wins).
	serving := map[string]string{
		"google_artifact_registry": "artifactregistry.googleapis.com", "google_bigquery": "bigquery.googleapis.com",
		"google_cloud_run": "run.googleapis.com", "google_cloud_scheduler": "cloudscheduler.googleapis.com",
		"google_logging": "logging.googleapis.com", "google_monitoring": "monitoring.googleapis.com",
		"google_pubsub": "pubsub.googleapis.com", "google_secret_manager": "secretmanager.googleapis.com",
		"google_service_account": "iam.googleapis.com", "google_project_iam": "cloudresourcemanager.googleapis.com",
		"google_sql": "sqladmin.googleapis.com", "google_storage": "storage.googleapis.com",
		"google_project_service": "serviceusage.googleapis.com",
	}
	for _, dir := range []string{".", "modules/workspace"} {
		for key := range parseModule(t, dir).resources {
			typ, _, _ := strings.Cut(key, ".")
			if !strings.HasPrefix(typ, "google_") {
				continue
			}
			api, longest := "", 0
			for prefix, a := range serving {
				if strings.HasPrefix(typ, prefix) && len(prefix) > longest {
					api, longest = a, len(prefix)
				}
			}
			require.NotEmpty(t, api, "%s: which API serves it? (add its prefix here)", typ)
			if api == "serviceusage.googleapis.com" {
				continue // enabled before the first plan (terraform/README.md)
			}
			require.True(t, apis[api], "%s needs %s, which apis.tf does not enable", typ, api)
		}
	}
}

// TestTerraformDeadLetterRolesLandOnTheirTopic: Pub/Sub's agent may
// publish to the dead-letter topic (not the events topic: dead-lettering
// would fail) and subscribe to the BigQuery subscription.
func TestTerraformDeadLetterRolesLandOnTheirTopic(t *testing.T) {
	t.Parallel()
	m := parseModule(t, "modules/workspace")
	attr := func(key, name string) string {
		b, ok := m.resources[key]
		require.True(t, ok, key)
		a, ok := b.Body.Attributes[name]
		require.True(t, ok, "%s.%s", key, name)
		return string(a.Expr.Range().SliceBytes(m.source[a.Expr.Range().Filename]))
	}
	require.Equal(t, "google_pubsub_topic.dead_letter.name", attr("google_pubsub_topic_iam_member.dead_letter_publisher", "topic"))
	require.Equal(t, `"roles/pubsub.publisher"`, attr("google_pubsub_topic_iam_member.dead_letter_publisher", "role"))
	require.Equal(t, "google_pubsub_subscription.bigquery.name", attr("google_pubsub_subscription_iam_member.agent_subscriber", "subscription"))
}
