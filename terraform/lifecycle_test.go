package terraform_test

import (
	"os"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/stretchr/testify/require"
	"github.com/zclconf/go-cty/cty"
)

// The deployment's way from an empty project and back, held by evaluating
// the HCL: the first apply waits for the log-based metrics before what
// names them, a destroy removes the build bucket and leaves the database
// users (their GRANTs are the operator's), the job people run by hand runs
// each command once, and the no-pass alert names the scheduler jobs there
// are.

// TestFirstApplyWaitsForTheMetrics: every alert policy, SLO and dashboard
// that names a log-based metric depends on time_sleep.metrics_known, which
// waits var.metrics_propagation_wait (10 minutes: Cloud Monitoring's own
// bound) after the metrics are created, and is made again when they
// change.
func TestFirstApplyWaitsForTheMetrics(t *testing.T) {
	t.Parallel()
	e := newMonitoringEval(t)
	sleep := e.m.resources["time_sleep.metrics_known"]
	require.NotNil(t, sleep, "the wait is there")
	require.Equal(t, "10m", e.value(sleep.Body.Attributes["create_duration"].Expr, nil).AsString())
	triggers := exprSource(e.m, sleep.Body.Attributes["triggers"].Expr)
	for _, metrics := range []string{"keys(google_logging_metric.counter)", "keys(google_logging_metric.distribution)"} {
		require.Contains(t, triggers, metrics, "a new metric of either kind waits again")
	}
	require.ElementsMatch(t, []string{"google_logging_metric.counter", "google_logging_metric.distribution"}, dependsOnList(e.m, sleep))
	naming := 0
	for key, b := range e.m.resources {
		kind, _, _ := strings.Cut(key, ".")
		if kind != "google_monitoring_alert_policy" && kind != "google_monitoring_slo" && kind != "google_monitoring_dashboard" {
			continue
		}
		text := string(b.Range().SliceBytes(e.m.source[b.Range().Filename]))
		if !strings.Contains(text, "metric_prefix") && !strings.Contains(text, "drain_failing") && !strings.Contains(text, "dashboard.json.tftpl") {
			continue // Pub/Sub's, Cloud SQL's or Cloud Run's own metrics, or the SLO's burn
		}
		naming++
		require.Contains(t, dependsOnList(e.m, b), "time_sleep.metrics_known", "%s names a log-based metric", key)
	}
	require.GreaterOrEqual(t, naming, 8)
}

// TestDestroyFinishes: the build bucket goes with its archives and cache,
// and the IAM database users are abandoned (PostgreSQL refuses to drop a
// role that holds GRANTs; the README says how to revoke and drop them).
func TestDestroyFinishes(t *testing.T) {
	t.Parallel()
	e := newMonitoringEval(t)
	bucket := e.m.resources["google_storage_bucket.build_sources"]
	require.True(t, e.value(bucket.Body.Attributes["force_destroy"].Expr, nil).True(), "the build bucket is destroyed with its objects")
	users := e.m.resources["google_sql_user.component"]
	require.Equal(t, "ABANDON", e.value(users.Body.Attributes["deletion_policy"].Expr, nil).AsString())
	readme := readREADME(t)
	for _, want := range []string{"REVOKE ALL", "DROP ROLE", "deletion_policy"} {
		require.Contains(t, readme, want, "the README's teardown")
	}
	// The views dataset goes with the views `job views` made in it; the
	// events dataset never goes with the events table, the evidence.
	ws := parseModule(t, "modules/workspace")
	views := ws.resources["google_bigquery_dataset.views"]
	require.NotNil(t, views)
	d, ok := views.Body.Attributes["delete_contents_on_destroy"]
	require.True(t, ok, "the views dataset is destroyed with its views")
	v, diags := d.Expr.Value(nil)
	require.False(t, diags.HasErrors())
	require.True(t, v.True())
	_, ok = ws.resources["google_bigquery_dataset.internal"].Body.Attributes["delete_contents_on_destroy"]
	require.False(t, ok, "the events dataset is never emptied by a destroy")
}

// TestOperatorCommandsRunOnce: replication-job (what people execute)
// retries nothing by default, and replication-audit never does, whatever
// job_max_retries says: a command that finds something exits 1, and a
// retry would only run it again.
func TestOperatorCommandsRunOnce(t *testing.T) {
	t.Parallel()
	e := newMonitoringEval(t)
	retries := func(v cty.Value) int64 { n, _ := v.AsBigFloat().Int64(); return n }
	require.Zero(t, retries(e.vars["job_max_retries"]), "the default")
	e.vars["job_max_retries"] = cty.NumberIntVal(5)
	e.vars["audit_schedule"] = cty.StringVal("0 3 * * *")
	e.vars["functions_image"] = cty.StringVal("repo/functions@sha256:1")
	e.vars["job_image"] = cty.StringVal("repo/job@sha256:2")
	ctx := &hcl.EvalContext{Functions: tfFunctions, Variables: map[string]cty.Value{"var": cty.ObjectVal(e.vars)}}
	evalLocals(e.m, ctx)
	jobs := ctx.Variables["local"].GetAttr("jobs").AsValueMap()
	require.EqualValues(t, 5, retries(jobs["replication-job"].GetAttr("max_retries")), "an operator may ask for retries")
	require.Zero(t, retries(jobs["replication-audit"].GetAttr("max_retries")), "the scheduled audit never retries")
}

// TestNoPassAlertNamesTheSchedulerJobs: the no-verifier-pass alert's
// documentation names the scheduler job that calls the verifier, or each
// of them when the verifier is sharded.
func TestNoPassAlertNamesTheSchedulerJobs(t *testing.T) {
	t.Parallel()
	for shards, want := range map[int64][]string{1: {"replication-verify "}, 3: {"replication-verify-0 ", "replication-verify-1 ", "replication-verify-2 "}} {
		e := newMonitoringEval(t)
		e.vars["verifier_shards"] = cty.NumberIntVal(shards)
		e.vars["region"] = cty.StringVal("europe-west1")
		ctx := &hcl.EvalContext{Functions: tfFunctions, Variables: map[string]cty.Value{"var": cty.ObjectVal(e.vars)}}
		evalLocals(e.m, ctx)
		jobs := ctx.Variables["local"].GetAttr("verify_scheduler_jobs").AsString()
		for _, name := range want {
			require.Contains(t, jobs, "gcloud scheduler jobs describe "+name, "%d shards", shards)
		}
		require.Equal(t, len(want), strings.Count(jobs, "gcloud scheduler jobs describe"), "%d shards: %s", shards, jobs)
		policy := e.m.resources["google_monitoring_alert_policy.verifier"]
		require.Contains(t, exprSource(e.m, policy.Body.Blocks[0].Body.Attributes["content"].Expr), "local.verify_scheduler_jobs")
	}
}

// dependsOnList lists a block's depends_on references.
func dependsOnList(m *tfModule, b *hclsyntax.Block) []string {
	a, ok := b.Body.Attributes["depends_on"]
	if !ok {
		return nil
	}
	var out []string
	for _, expr := range a.Expr.(*hclsyntax.TupleConsExpr).Exprs {
		out = append(out, exprSource(m, expr))
	}
	return out
}

// readREADME reads terraform/README.md.
func readREADME(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("README.md")
	require.NoError(t, err)
	return string(raw)
}
