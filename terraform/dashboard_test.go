package terraform_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/stretchr/testify/require"
	"github.com/zclconf/go-cty/cty"
)

// TestTerraformMonitoringReferencesExistingMetrics: every metric the alert
// policies, the SLO and the dashboard read is one of the log-based metrics
// terraform defines or a Google metric that exists.
func TestTerraformMonitoringReferencesExistingMetrics(t *testing.T) {
	t.Parallel()
	m := parseModule(t, ".")
	defined := map[string]bool{}
	for _, name := range []string{"log_counters", "log_distributions"} {
		v, diags := m.locals[name].Expr.Value(nil)
		require.False(t, diags.HasErrors(), "%s: %s", name, diags)
		for metric := range v.AsValueMap() {
			defined["logging.googleapis.com/user/"+metric] = true
		}
	}
	google := map[string]bool{"pubsub.googleapis.com/subscription/num_undelivered_messages": true,
		"pubsub.googleapis.com/subscription/oldest_unacked_message_age": true, "pubsub.googleapis.com/subscription/push_request_count": true,
		"run.googleapis.com/job/completed_execution_count": true, "cloudsql.googleapis.com/database/postgresql/num_backends": true}
	metricType := regexp.MustCompile(`metric\.type=\\?"([^"\\]+)\\?"`)
	check := func(where, text string) int {
		n := 0
		// The lag alerts name their metric in their map (metric = "…").
		for _, match := range regexp.MustCompile(`(?m)^\s*metric\s*=\s*"([^"]+)"`).FindAllStringSubmatch(text, -1) {
			require.True(t, defined["logging.googleapis.com/user/"+match[1]], "%s reads %s, which no metric defines", where, match[1])
			n++
		}
		for _, match := range metricType.FindAllStringSubmatch(text, -1) {
			if strings.Contains(match[1], "${each.value.metric}") {
				continue // checked above
			}
			typ := strings.ReplaceAll(strings.ReplaceAll(match[1], "${local.metric_prefix}", "logging.googleapis.com/user/"), "${prefix}", "logging.googleapis.com/user/")
			require.True(t, defined[typ] || google[typ], "%s reads %s, which no metric defines", where, typ)
			n++
		}
		return n
	}
	monitoring, err := os.ReadFile("monitoring.tf")
	require.NoError(t, err)
	alerts, err := os.ReadFile("alerts.tf")
	require.NoError(t, err)
	require.GreaterOrEqual(t, check("monitoring.tf", string(monitoring))+check("alerts.tf", string(alerts)), 13)
	// PromQL names a log-based metric logging_googleapis_com:user_<name, / as _>.
	for _, match := range regexp.MustCompile(`logging_googleapis_com:user_(\w+)`).FindAllStringSubmatch(string(alerts), -1) {
		found := false
		for typ := range defined {
			found = found || strings.ReplaceAll(strings.TrimPrefix(typ, "logging.googleapis.com/user/"), "/", "_") == match[1]
		}
		require.True(t, found, "alerts.tf's PromQL reads %s, which no metric defines", match[0])
	}
	dashboard, err := os.ReadFile("dashboard.json.tftpl")
	require.NoError(t, err)
	parsed := renderDashboard(t, true)
	require.GreaterOrEqual(t, check("dashboard.json.tftpl", string(dashboard)), 10)
	require.NotEmpty(t, parsed["mosaicLayout"])
}

// renderDashboard renders dashboard.json.tftpl as templatefile does, and
// parses the JSON.
func renderDashboard(t *testing.T, workspaceGauges bool) map[string]any {
	t.Helper()
	raw, err := os.ReadFile("dashboard.json.tftpl")
	require.NoError(t, err)
	tpl, diags := hclsyntax.ParseTemplate(raw, "dashboard.json.tftpl", hcl.InitialPos)
	require.False(t, diags.HasErrors(), diags.Error())
	v, diags := tpl.Value(&hcl.EvalContext{Variables: map[string]cty.Value{
		"prefix": cty.StringVal("logging.googleapis.com/user/"), "workspace_gauges": cty.BoolVal(workspaceGauges)}})
	require.False(t, diags.HasErrors(), diags.Error())
	var parsed map[string]any
	require.NoError(t, json.Unmarshal([]byte(v.AsString()), &parsed), "the dashboard is JSON")
	return parsed
}

// TestDashboardTilesGroupByTheirMetricsLabels: every tile groups by labels
// its metric has (with and without workspace_gauges), and a tile whose
// title says "by workspace" groups by the workspace label.
func TestDashboardTilesGroupByTheirMetricsLabels(t *testing.T) {
	t.Parallel()
	m := parseModule(t, ".")
	labelsOf := func(gauges bool) map[string][]string {
		out := map[string][]string{"pubsub.googleapis.com/subscription/num_undelivered_messages": {"resource.label.subscription_id"}}
		counters, diags := m.locals["log_counters"].Expr.Value(nil)
		require.False(t, diags.HasErrors())
		for name, spec := range counters.AsValueMap() {
			for _, l := range spec.GetAttr("labels").AsValueSlice() {
				out["logging.googleapis.com/user/"+name] = append(out["logging.googleapis.com/user/"+name], "metric.label."+l.AsString())
			}
		}
		dists, diags := m.locals["log_distributions"].Expr.Value(nil)
		require.False(t, diags.HasErrors())
		for name, spec := range dists.AsValueMap() {
			key := "logging.googleapis.com/user/" + name
			out[key] = []string{}
			if spec.GetAttr("by_workspace").True() && gauges {
				out[key] = []string{"metric.label.workspace"}
			}
			for _, l := range spec.GetAttr("labels").AsValueSlice() {
				out[key] = append(out[key], "metric.label."+l.AsString())
			}
		}
		return out
	}
	metricType := regexp.MustCompile(`metric\.type="([^"]+)"`)
	for _, gauges := range []bool{true, false} {
		labels := labelsOf(gauges)
		tiles := 0
		for _, tile := range renderDashboard(t, gauges)["mosaicLayout"].(map[string]any)["tiles"].([]any) {
			widget := tile.(map[string]any)["widget"].(map[string]any)
			title := widget["title"].(string)
			for _, ds := range widget["xyChart"].(map[string]any)["dataSets"].([]any) {
				f := ds.(map[string]any)["timeSeriesQuery"].(map[string]any)["timeSeriesFilter"].(map[string]any)
				metric := metricType.FindStringSubmatch(f["filter"].(string))[1]
				have, ok := labels[metric]
				require.True(t, ok, "%s: metric %s", title, metric)
				var groups []string
				for _, g := range f["aggregation"].(map[string]any)["groupByFields"].([]any) {
					groups = append(groups, g.(string))
					require.Contains(t, have, g, "tile %q groups %s by %s, a label it does not have (workspace_gauges %v)", title, metric, g, gauges)
				}
				if strings.Contains(title, "by workspace") && gauges {
					require.Contains(t, groups, "metric.label.workspace", "tile %q", title)
				}
				tiles++
			}
		}
		require.GreaterOrEqual(t, tiles, 14)
	}
}
