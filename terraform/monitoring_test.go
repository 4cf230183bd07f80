package terraform_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/segmentstream/ontology-replication/shared/testbench/logbuf"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/stretchr/testify/require"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
	ctyjson "github.com/zclconf/go-cty/cty/json"

	"github.com/segmentstream/ontology-replication/functions"
	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/logging"
	"github.com/segmentstream/ontology-replication/shared/testbench/pipeline"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// syncBuffer is a log destination shared by concurrent requests.
type syncBuffer = logbuf.Buffer

// functionLogs runs the real functions (a drain, then a verifier pass) over
// real parts and returns the lines they logged.
func functionLogs(t *testing.T) []map[string]any {
	t.Helper()
	ctx := context.Background()
	p := pipeline.OneWorkspace(t, 5)
	env := map[string]string{
		"REPLICATION_WORKSPACES":       p.Registry,
		"PUBSUB_EMULATOR_HOST":         p.PubSub.Addr,
		functions.EnvVerifyCallerCheck: "off",
	}
	var logs syncBuffer
	local, err := functions.NewHandler(ctx, func(k string) string { return env[k] },
		functions.LocalOptions{Logger: logging.New(&logs, logging.Config{Level: slog.LevelInfo, ProjectID: "p1"})})
	require.NoError(t, err)
	t.Cleanup(local.Close)
	handler := local.Handler
	token, err := p.Issuer.Token(pipeline.RuntimeSubject, pipeline.Audience, time.Minute)
	require.NoError(t, err)
	req := httptest.NewRequest(http.MethodPost, "/api/internal/v1/workspaces/w1/ontology/replication/drain", nil)
	req.Header.Set("x-segmentstream-runtime-identity", token)
	req.Header.Set("x-segmentstream-organization-id", pipeline.Organization)
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	idle, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, local.Idle(idle), "the drainer's line is written when it ends")
	// A caller with no token: the drain's line has no workspace.
	rec = httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/api/internal/v1/workspaces/w1/ontology/replication/drain", nil))
	require.Equal(t, http.StatusUnauthorized, rec.Code, rec.Body.String())
	rec = httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/Verify", strings.NewReader("{}")))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	// A refused verifier call: its sampled line counts it.
	rec = httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/Verify", nil))
	require.Equal(t, http.StatusMethodNotAllowed, rec.Code, rec.Body.String())
	// The verifier's grant revoked: BigQuery answers 403, and each pass
	// says so on the workspace's line.
	p.DenyBigQuery.Store(true)
	for range 2 {
		_, err := p.Pool.Exec(ctx, `UPDATE _ontology_replication_delivery SET next_verify_at = now(), verified_at = NULL, accepted_at = coalesce(accepted_at, now())`)
		require.NoError(t, err)
		rec = httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/Verify", strings.NewReader("{}")))
		require.Equal(t, http.StatusInternalServerError, rec.Code, rec.Body.String())
	}
	// The topic deleted: the drainer fails, with its cause (an ERROR: a
	// person must act), and the wake-up after it is answered 500.
	require.NoError(t, sdkfixture.BulkCreate(ctx, p.Pool, sdkfixture.Demo, "product", "title", 2, 2))
	_, err = p.PubSub.GServer.DeleteTopic(ctx, &pubsubpb.DeleteTopicRequest{Topic: pipeline.Topic})
	require.NoError(t, err)
	wake := func() int {
		req := httptest.NewRequest(http.MethodPost, "/api/internal/v1/workspaces/w1/ontology/replication/drain", nil)
		req.Header.Set("x-segmentstream-runtime-identity", token)
		req.Header.Set("x-segmentstream-organization-id", pipeline.Organization)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		return rec.Code
	}
	require.Equal(t, http.StatusOK, wake())
	deadline := time.Now().Add(time.Minute)
	for wake() != http.StatusInternalServerError {
		require.True(t, time.Now().Before(deadline), "no 500 while the drainer fails on a missing topic")
		time.Sleep(10 * time.Millisecond) // the drainer's own fault is the signal
	}
	return parseLines(t, logs.String())
}

// parseLines parses JSON log lines.
func parseLines(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		var entry map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &entry), line)
		lines = append(lines, entry)
	}
	return lines
}

// auditLogs are the job's audit lines, one per outcome, as
// delivery.LogAuditResult writes them, and a process's connections line
// (delivery.LogConnectionsOpened).
func auditLogs(t *testing.T) []map[string]any {
	t.Helper()
	var logs syncBuffer
	log := logging.New(&logs, logging.Config{Level: slog.LevelInfo, ProjectID: "p1"})
	ctx := context.Background()
	delivery.LogAuditResult(ctx, log, "w1", delivery.AuditReport{Generation: "g", Equal: true}, nil)
	delivery.LogAuditResult(ctx, log, "w1", delivery.AuditReport{Generation: "g", Differences: 2, Repairable: 1}, nil)
	delivery.LogAuditResult(ctx, log, "w1", delivery.AuditReport{}, errors.New("database unreachable"))
	// A process's minute of connections to a server (ReportConnections).
	delivery.LogConnectionsOpened(ctx, log, "project:region:instance", 12, 3, delivery.ConnectionsInterval)
	return parseLines(t, logs.String())
}

// TestTerraformLogMetricsReadTheCodesLines: each log-based metric's filter
// selects lines the code writes (its message is the code's constant), and
// the fields it extracts are on those lines: numbers for the values,
// strings for the labels. A renamed field or message fails here, not in a
// dashboard that silently goes flat.
func TestTerraformLogMetricsReadTheCodesLines(t *testing.T) {
	t.Parallel()
	m := parseModule(t, ".")
	value := func(name string) map[string]any {
		v, diags := m.locals[name].Expr.Value(nil)
		require.False(t, diags.HasErrors(), "local.%s: %s", name, diags)
		raw, err := ctyjson.Marshal(v, v.Type())
		require.NoError(t, err)
		var out map[string]any
		require.NoError(t, json.Unmarshal(raw, &out))
		return out
	}
	lineFilters := value("log_lines")
	message := regexp.MustCompile(`jsonPayload\.message="([^"]+)"`)
	messages := map[string]string{}
	for kind, f := range lineFilters {
		match := message.FindStringSubmatch(f.(string))
		require.NotNil(t, match, "%s: the filter selects a message", kind)
		messages[kind] = match[1]
	}
	require.Equal(t, map[string]string{"drain": functions.LogDrain, "drain_run": delivery.LogDrainRun, "drain_fault": delivery.LogDrainFault,
		"verify_workspace": delivery.LogVerifyWorkspace, "verify_pass": functions.LogVerify, "audit": delivery.LogAudit,
		"connections": delivery.LogConnections}, messages,
		"the filters select the code's messages")

	bandsValue, diags := m.locals["lag_bands"].Expr.Value(nil)
	require.False(t, diags.HasErrors())
	var bands []string
	for _, b := range bandsValue.AsValueSlice() {
		bands = append(bands, b.AsString())
	}
	var want []string
	for _, b := range delivery.LagBands() {
		want = append(want, b.Name)
	}
	require.Equal(t, want, bands, "terraform's lag bands are the code's")
	for minutes, i := range value("band_index") {
		require.Equal(t, minutes+"m0s", strings.Replace(delivery.LagBands()[int(i.(float64))].Under.String(), "1h0m0s", "60m0s", 1),
			"band %d is under %s minutes", int(i.(float64)), minutes)
	}

	lines := append(functionLogs(t), auditLogs(t)...)
	byMessage := map[string][]map[string]any{}
	for _, l := range lines {
		msg, _ := l["message"].(string)
		byMessage[msg] = append(byMessage[msg], l)
	}
	// Labels present on some lines only: a cause on failures, and the
	// drain's workspace once its caller is authenticated for it.
	sometimes := map[string]func(l map[string]any) bool{
		"cause": func(l map[string]any) bool {
			return l["outcome"] == "failed" || l["status"] == 500.0 || l["status"] == 503.0 || l["message"] == delivery.LogDrainFault
		},
		"workspace": func(l map[string]any) bool {
			return l["outcome"] != "unauthorized" && l["outcome"] != "unknown_workspace"
		},
	}
	for metric, spec := range value("log_counters") {
		s := spec.(map[string]any)
		matching := byMessage[messages[s["line"].(string)]]
		require.NotEmpty(t, matching, "%s: no line of the code matches its filter", metric)
		for _, label := range s["labels"].([]any) {
			seen := false
			for _, l := range matching {
				v, ok := l[label.(string)].(string)
				if when, optional := sometimes[label.(string)]; optional && !when(l) {
					require.False(t, ok, "%s: label %s on %v", metric, label, l)
					continue
				}
				require.True(t, ok && v != "", "%s: label %s is not a string field of %v", metric, label, l)
				seen = true
			}
			require.True(t, seen, "%s: no line carries label %s", metric, label)
		}
	}
	// The failed workspace's lines: outcome failed (what the workspace
	// alert counts), the cause, and bands the SLO's total counts.
	failedLines := 0
	for _, l := range byMessage[delivery.LogVerifyWorkspace] {
		if l["outcome"] == "failed" {
			failedLines++
			require.Equal(t, delivery.CauseWarehouseDenied, l["cause"], "%v", l)
			require.Contains(t, append(slices.Clone(bands), delivery.BandUnknown), l["outstanding_band"])
			require.Contains(t, l, "oldest_unverified_age_seconds", "its figures are read though BigQuery refused: the lag keeps showing")
		}
	}
	require.Equal(t, 2, failedLines, "one failure line per pass")
	// Every pass that ran (one that verified, two with a failed workspace)
	// is one the "no verifier pass" alert counts as a pass.
	e := newMonitoringEval(t)
	ran := oneOf(t, e.conditions("verifier")["/no verifier pass"].filter, "metric.labels.outcome")
	var passes []map[string]any
	for _, l := range byMessage[functions.LogVerify] {
		if _, refused := l["refused"]; !refused {
			passes = append(passes, l)
		}
	}
	require.Len(t, passes, 3)
	for _, l := range passes {
		require.Contains(t, ran, l["outcome"], "a pass that ran, logged as %v, would page \"no verifier pass\"", l["outcome"])
	}
	for metric, spec := range value("log_distributions") {
		s := spec.(map[string]any)
		matching := byMessage[messages[s["line"].(string)]]
		require.NotEmpty(t, matching, "%s: no line of the code matches its filter", metric)
		field := s["field"].(string)
		// The filter takes the lines with the field (jsonPayload.<field>>=0):
		// those of invocations that got as far as the work, and always the
		// successful ones.
		with := 0
		for _, l := range matching {
			raw, present := l[field]
			if !present {
				if field != "refused" { // on the sampled lines of refused calls only
					require.NotEqual(t, "ok", l["outcome"], "%s: a successful line without %s", metric, field)
				}
				continue
			}
			with++
			v, ok := raw.(float64)
			require.True(t, ok, "%s extracts %s, which is not a number on %v", metric, field, l)
			require.GreaterOrEqual(t, v, 0.0)
			if s["by_workspace"] == true {
				ws, _ := l["workspace"].(string)
				require.Equal(t, "w1", ws, "%s: its workspace label", metric)
			}
			for _, label := range s["labels"].([]any) {
				v, _ := l[label.(string)].(string)
				require.NotEmpty(t, v, "%s: its label %s on %v", metric, label, l)
			}
		}
		require.Positive(t, with, "%s: no line carries %s", metric, field)
	}
}

// TestTerraformMonitorsEveryPubSubProject: the dead-letter alert reads
// Pub/Sub's metrics in the deployment project's metrics scope, so every
// workspace's Pub/Sub project other than the deployment project joins it
// (evaluated from the HCL), and the alert reads the subscriptions the
// workspace module names "<topic>-dead-letter".
func TestTerraformMonitorsEveryPubSubProject(t *testing.T) {
	t.Parallel()
	m := parseModule(t, ".")
	ws := func(project, sql string) cty.Value {
		return cty.ObjectVal(map[string]cty.Value{"pubsub_project": cty.StringVal(project), "sql_project": cty.StringVal(sql)})
	}
	ctx := &hcl.EvalContext{Functions: map[string]function.Function{"concat": stdlib.ConcatFunc, "toset": function.New(&function.Spec{
		Params: []function.Parameter{{Name: "v", Type: cty.DynamicPseudoType}},
		Type:   function.StaticReturnType(cty.Set(cty.String)),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			if args[0].LengthInt() == 0 {
				return cty.SetValEmpty(cty.String), nil
			}
			return cty.SetVal(args[0].AsValueSlice()), nil
		},
	})}, Variables: map[string]cty.Value{
		"var":   cty.ObjectVal(map[string]cty.Value{"project": cty.StringVal("acme")}),
		"local": cty.ObjectVal(map[string]cty.Value{"workspaces": cty.ObjectVal(map[string]cty.Value{"w1": ws("acme", "acme"), "w2": ws("ps-two", "sql-two"), "w3": ws("ps-two", "acme"), "w4": ws("ps-four", "sql-two")})}),
	}}
	got, diags := m.locals["monitored_projects"].Expr.Value(ctx)
	require.False(t, diags.HasErrors(), diags.Error())
	var projects []string
	for _, v := range got.AsValueSlice() {
		projects = append(projects, v.AsString())
	}
	sort.Strings(projects)
	require.Equal(t, []string{"ps-four", "ps-two", "sql-two"}, projects)
	mp := m.resources["google_monitoring_monitored_project.pubsub"]
	require.NotNil(t, mp)
	require.Contains(t, string(mp.Body.Attributes["for_each"].Expr.Range().SliceBytes(m.source[mp.Body.Attributes["for_each"].Expr.Range().Filename])), "local.monitored_projects")

	child := parseModule(t, "modules/workspace")
	name := child.resources["google_pubsub_subscription.dead_letter"].Body.Attributes["name"].Expr
	require.Equal(t, `"${var.topic_id}-dead-letter"`, string(name.Range().SliceBytes(child.source[name.Range().Filename])))
	alert := m.resources["google_monitoring_alert_policy.dead_letters"]
	var filter string
	walk(alert.Body, nil, func(n string, expr hclsyntax.Expression, _ []string) {
		if n == "filter" {
			v, _ := expr.Value(nil)
			filter = v.AsString()
		}
	})
	require.Contains(t, filter, `resource.labels.subscription_id=monitoring.regex.full_match(".*-dead-letter")`)
}
