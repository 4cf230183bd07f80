package terraform_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zclconf/go-cty/cty"
)

// alertSeverities evaluates every alert policy of the HCL, each instance of
// its for_each (one stand-in instance where the defaults give none), to
// its name as the README calls it ("Ontology replication: " and an
// instance's " on …" or " (…)" cut) and how it notifies: "page"
// (CRITICAL) or "ticket" (WARNING).
func alertSeverities(t *testing.T) map[string]string {
	t.Helper()
	e := newMonitoringEval(t)
	notifies := map[string]string{"CRITICAL": "page", "WARNING": "ticket"}
	suffix := regexp.MustCompile(` (on \S+|\(.*\))$`)
	out := map[string]string{}
	for key, b := range e.m.resources {
		if !strings.HasPrefix(key, "google_monitoring_alert_policy.") {
			continue
		}
		instances := []map[string]cty.Value{nil}
		if fe, ok := b.Body.Attributes["for_each"]; ok {
			instances = nil
			// One from resources the HCL makes (Cloud SQL instances)
			// does not evaluate here: a stand-in instance then.
			if v, diags := fe.Expr.Value(e.ctx); !diags.HasErrors() {
				for k, v := range v.AsValueMap() {
					instances = append(instances, map[string]cty.Value{"key": cty.StringVal(k), "value": v})
				}
			}
			if len(instances) == 0 {
				instances = append(instances, map[string]cty.Value{"key": cty.StringVal("p:r:i"),
					"value": cty.ObjectVal(map[string]cty.Value{"name": cty.StringVal("i")})})
			}
		}
		for _, each := range instances {
			name := e.value(b.Body.Attributes["display_name"].Expr, each).AsString()
			name = suffix.ReplaceAllString(strings.TrimPrefix(name, "Ontology replication: "), "")
			severity := e.value(b.Body.Attributes["severity"].Expr, each).AsString()
			require.Contains(t, notifies, severity, "%s: %s", key, name)
			out[name] = notifies[severity]
		}
	}
	return out
}

// runbookSeverities reads the README's runbook table: each row's alert and
// the severity in brackets after it.
func runbookSeverities(t *testing.T, readme string) map[string]string {
	t.Helper()
	_, table, found := strings.Cut(readme, "| alert (severity) |")
	require.True(t, found, "the runbook's table")
	table, _, _ = strings.Cut(table, "\n\n")
	row := regexp.MustCompile(`(?m)^\| ([^|(]+) \((page|ticket)\) \|`)
	out := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(table, -1) {
		require.NotContains(t, out, m[1], "one row an alert")
		out[m[1]] = m[2]
	}
	return out
}

// TestTerraformRunbookAgreesWithTheAlerts: the runbook's table names every
// alert policy the HCL makes, and no other, each with the severity the HCL
// gives it; and the Variables table gives the defaults of the variables
// whose values an operator reads there as the HCL has them.
func TestTerraformRunbookAgreesWithTheAlerts(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("README.md")
	require.NoError(t, err)
	readme := string(raw)
	hcl := alertSeverities(t)
	require.GreaterOrEqual(t, len(hcl), 16, "every policy evaluated: %v", hcl)
	require.Equal(t, hcl, runbookSeverities(t, readme), "terraform/README.md's runbook and alerts.tf")

	e := newMonitoringEval(t)
	str := func(name string) string {
		v := e.vars[name]
		if v.Type() == cty.Number {
			return v.AsBigFloat().Text('f', -1)
		}
		return v.AsString()
	}
	for _, c := range []struct{ row, want string }{
		{"| `job_task_timeout`, `job_max_retries` |", "retries (" + str("job_max_retries") + ", from 0 to 10"},
		{"| `metrics_propagation_wait` |", "(" + str("metrics_propagation_wait") + ":"},
		{"| `iam_propagation_wait` |", "(" + str("iam_propagation_wait") + ";"},
		{"| `dead_letter_max_delivery_attempts` |", "(" + str("dead_letter_max_delivery_attempts") + ", from 5 to 100)"},
	} {
		_, rest, found := strings.Cut(readme, c.row)
		require.True(t, found, "the Variables table has the row %s", c.row)
		line, _, _ := strings.Cut(rest, "\n")
		require.Contains(t, line, c.want, "the row %s gives the HCL's default", c.row)
	}
	// Every variable is in the Variables table.
	_, vars, _ := strings.Cut(readme, "## Variables")
	vars, _, _ = strings.Cut(vars, "\n## ")
	for name := range e.m.variables {
		require.Contains(t, vars, "`"+name+"`", "terraform/README.md's Variables table names var.%s", name)
	}
}

// TestTerraformAlertsSayWhereAJobsOutputIs: an alert's documentation that
// gives a `gcloud run jobs execute … --async` command (which, pasted
// alone, prints only that the execution started) says where its output
// is, and the runbook gives commands that print it.
func TestTerraformAlertsSayWhereAJobsOutputIs(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("alerts.tf")
	require.NoError(t, err)
	giving := 0
	for i, line := range strings.Split(string(raw), "\n") {
		if !strings.Contains(line, "${local.job_command}") {
			continue
		}
		giving++
		require.Contains(t, line, "${local.job_output}", "alerts.tf:%d gives a job command without where its output is", i+1)
	}
	require.GreaterOrEqual(t, giving, 8)
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	for _, want := range []string{"--format='value(textPayload)'", "--format='json(jsonPayload)'", "status.failedCount.yesno(no=0)"} {
		require.Contains(t, string(readme), want, "the runbook reads an execution's output")
	}
}
