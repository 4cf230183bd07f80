package terraform_test

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/stretchr/testify/require"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"

	"github.com/segmentstream/ontology-replication/shared/delivery"
)

// tfFunctions are the terraform functions the monitoring's expressions use.
var tfFunctions = map[string]function.Function{
	"join": stdlib.JoinFunc, "slice": stdlib.SliceFunc, "length": stdlib.LengthFunc, "concat": stdlib.ConcatFunc,
	"contains": stdlib.ContainsFunc, "keys": stdlib.KeysFunc, "min": stdlib.MinFunc, "max": stdlib.MaxFunc,
	"floor": stdlib.FloorFunc, "lookup": stdlib.LookupFunc, "upper": stdlib.UpperFunc, "range": stdlib.RangeFunc, "merge": stdlib.MergeFunc,
	"tostring": function.New(&function.Spec{
		Params: []function.Parameter{{Name: "v", Type: cty.DynamicPseudoType}},
		Type:   function.StaticReturnType(cty.String),
		Impl:   func(args []cty.Value, _ cty.Type) (cty.Value, error) { return convert.Convert(args[0], cty.String) },
	}),
}

// evalLocals evaluates the module's locals that ctx (its var, mocks and
// functions) can evaluate, each in turn once those it reads are known, and
// sets ctx's local to them.
func evalLocals(m *tfModule, ctx *hcl.EvalContext) {
	locals := map[string]cty.Value{}
	for progress := true; progress; {
		progress = false
		for name, a := range m.locals {
			if _, done := locals[name]; done {
				continue
			}
			ctx.Variables["local"] = cty.ObjectVal(locals)
			if v, diags := a.Expr.Value(ctx); !diags.HasErrors() && v.IsWhollyKnown() {
				locals[name] = v
				progress = true
			}
		}
	}
	ctx.Variables["local"] = cty.ObjectVal(locals)
}

// monitoringEval evaluates the deployment's monitoring expressions as
// terraform would with every variable at its default: var, the locals that
// need no resource, and each (for a for_each's element).
type monitoringEval struct {
	t    *testing.T
	m    *tfModule
	vars map[string]cty.Value
	ctx  *hcl.EvalContext
}

func newMonitoringEval(t *testing.T) *monitoringEval {
	t.Helper()
	m := parseModule(t, ".")
	e := &monitoringEval{t: t, m: m, vars: map[string]cty.Value{}}
	for name, b := range m.variables {
		if d, ok := b.Body.Attributes["default"]; ok {
			v, diags := d.Expr.Value(nil)
			require.False(t, diags.HasErrors(), "var.%s: %s", name, diags)
			e.vars[name] = v
		}
	}
	e.vars["project"] = cty.StringVal("acme")
	e.ctx = &hcl.EvalContext{Functions: tfFunctions, Variables: map[string]cty.Value{"var": cty.ObjectVal(e.vars)}}
	evalLocals(m, e.ctx)
	// The one resource the conditions name: the SLO the burn rates select.
	e.ctx.Variables["google_monitoring_slo"] = cty.ObjectVal(map[string]cty.Value{"verified_in_time": cty.ObjectVal(map[string]cty.Value{
		"name": cty.StringVal("projects/acme/services/ontology-replication/serviceLevelObjectives/slo"), "display_name": cty.StringVal("slo")})})
	return e
}

// value evaluates an expression, with each set when given.
func (e *monitoringEval) value(expr hclsyntax.Expression, each map[string]cty.Value) cty.Value {
	e.t.Helper()
	ctx := e.ctx.NewChild()
	ctx.Variables = map[string]cty.Value{}
	if each != nil {
		ctx.Variables["each"] = cty.ObjectVal(each)
	}
	v, diags := expr.Value(ctx)
	require.False(e.t, diags.HasErrors(), "%s: %s", expr.Range(), diags)
	return v
}

// condition is one alert condition with its values evaluated.
type condition struct {
	kind                         string // condition_threshold, condition_absent or condition_prometheus_query_language
	filter, duration, comparison string // filter: the PromQL query of the last
	threshold                    float64
	alignment, aligner, reducer  string
	groupBy                      []string
}

// conditions evaluates an alert policy's conditions (each element of its
// for_each, each element of a dynamic "conditions"): keyed by the policy's
// for_each key and the condition's display name.
func (e *monitoringEval) conditions(key string) map[string]condition {
	e.t.Helper()
	b := e.m.resources["google_monitoring_alert_policy."+key]
	require.NotNil(e.t, b, key)
	instances := map[string]map[string]cty.Value{"": nil}
	if fe, ok := b.Body.Attributes["for_each"]; ok {
		instances = map[string]map[string]cty.Value{}
		for k, v := range e.value(fe.Expr, nil).AsValueMap() {
			instances[k] = map[string]cty.Value{"key": cty.StringVal(k), "value": v}
		}
	}
	out := map[string]condition{}
	for instance, each := range instances {
		for _, blk := range b.Body.Blocks {
			switch {
			case blk.Type == "conditions":
				c := e.condition(blk.Body, each, nil)
				out[instance+"/"+c.name] = c.condition
			case blk.Type == "dynamic" && blk.Labels[0] == "conditions":
				for k, v := range e.value(blk.Body.Attributes["for_each"].Expr, each).AsValueMap() {
					iter := map[string]cty.Value{"conditions": cty.ObjectVal(map[string]cty.Value{"key": cty.StringVal(k), "value": v})}
					c := e.condition(blk.Body.Blocks[0].Body, each, iter)
					out[instance+"/"+c.name] = c.condition
				}
			}
		}
	}
	return out
}

type namedCondition struct {
	name string
	condition
}

func (e *monitoringEval) condition(body *hclsyntax.Body, each, iter map[string]cty.Value) namedCondition {
	eval := func(expr hclsyntax.Expression) cty.Value {
		ctx := e.ctx.NewChild()
		ctx.Variables = map[string]cty.Value{}
		for k, v := range iter {
			ctx.Variables[k] = v
		}
		if each != nil {
			ctx.Variables["each"] = cty.ObjectVal(each)
		}
		v, diags := expr.Value(ctx)
		require.False(e.t, diags.HasErrors(), "%s: %s", expr.Range(), diags)
		return v
	}
	str := func(b *hclsyntax.Body, name string) string {
		if a, ok := b.Attributes[name]; ok {
			return eval(a.Expr).AsString()
		}
		return ""
	}
	var c namedCondition
	c.name = str(body, "display_name")
	for _, blk := range body.Blocks {
		switch blk.Type {
		case "condition_threshold", "condition_absent":
		case "condition_prometheus_query_language":
			c.kind, c.filter, c.duration = blk.Type, str(blk.Body, "query"), str(blk.Body, "duration")
			continue
		default:
			continue
		}
		c.kind = blk.Type
		c.filter, c.duration, c.comparison = str(blk.Body, "filter"), str(blk.Body, "duration"), str(blk.Body, "comparison")
		if a, ok := blk.Body.Attributes["threshold_value"]; ok {
			c.threshold, _ = eval(a.Expr).AsBigFloat().Float64()
		}
		for _, agg := range blk.Body.Blocks {
			if agg.Type != "aggregations" {
				continue
			}
			c.alignment, c.aligner, c.reducer = str(agg.Body, "alignment_period"), str(agg.Body, "per_series_aligner"), str(agg.Body, "cross_series_reducer")
			if g, ok := agg.Body.Attributes["group_by_fields"]; ok {
				for _, v := range eval(g.Expr).AsValueSlice() {
					c.groupBy = append(c.groupBy, v.AsString())
				}
			}
		}
	}
	return c
}

// oneOf lists the values of a filter's label=one_of(…) (or label="…").
func oneOf(t *testing.T, filter, label string) []string {
	t.Helper()
	if m := regexp.MustCompile(regexp.QuoteMeta(label) + `=one_of\(([^)]*)\)`).FindStringSubmatch(filter); m != nil {
		var out []string
		for _, v := range strings.Split(m[1], ",") {
			out = append(out, strings.Trim(strings.TrimSpace(v), `"`))
		}
		sort.Strings(out)
		return out
	}
	m := regexp.MustCompile(regexp.QuoteMeta(label) + `="([^"]*)"`).FindStringSubmatch(filter)
	require.NotNil(t, m, "%s filters no %s", filter, label)
	return []string{m[1]}
}

// bandsFrom are the verifier's lag bands whose lags are at least minutes
// (over: the alert's), or at most (upto: the SLO's good ones), from
// delivery.LagBands.
func bandsFrom(minutes int, over bool) []string {
	var out []string
	lower := 0
	for _, b := range delivery.LagBands() {
		upper := int(b.Under.Minutes())
		switch {
		case over && lower >= minutes:
			out = append(out, b.Name)
		case !over && b.Under != 0 && upper <= minutes:
			out = append(out, b.Name)
		}
		lower = upper
	}
	sort.Strings(out)
	return out
}

// TestTerraformAlertThresholds: the alert policies and the SLO, evaluated
// from the HCL with the variables' defaults, page at the values the READMEs
// document, on the bands and outcomes the code writes. A threshold, a
// window or a band changed in the HCL fails here, in CI, where terraform
// test cannot run.
func TestTerraformAlertThresholds(t *testing.T) {
	t.Parallel()
	e := newMonitoringEval(t)
	num := func(name string) float64 {
		f, _ := e.vars[name].AsBigFloat().Float64()
		return f
	}
	// The documented defaults.
	want := map[string]float64{"delivery_lag_alert_minutes": 5, "verification_lag_alert_minutes": 30, "drain_failure_ratio_alert": 0.1,
		"slo_minutes": 30, "slo_goal": 0.999, "verifier_failure_passes": 3, "set_aside_alert_minutes": 15,
		"subscription_backlog_alert_minutes": 10, "drain_failure_min_count": 10, "connections_alert_ratio": 0.9}
	for name, v := range want {
		require.Equal(t, v, num(name), "var.%s's default", name)
	}
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	for _, doc := range []string{
		fmt.Sprintf("`delivery_lag_alert_minutes`, %v", want["delivery_lag_alert_minutes"]),
		fmt.Sprintf("`verification_lag_alert_minutes`, %v", want["verification_lag_alert_minutes"]),
		fmt.Sprintf("`drain_failure_ratio_alert`, %v%%", want["drain_failure_ratio_alert"]*100),
		fmt.Sprintf("`slo_minutes` (%v)", want["slo_minutes"]),
		fmt.Sprintf("`slo_goal` (%v%%)", want["slo_goal"]*100),
		fmt.Sprintf("`verifier_failure_passes`, %v", want["verifier_failure_passes"]),
		fmt.Sprintf("`set_aside_alert_minutes`, %v", want["set_aside_alert_minutes"]),
		fmt.Sprintf("`subscription_backlog_alert_minutes`, %v", want["subscription_backlog_alert_minutes"]),
		fmt.Sprintf("`drain_failure_min_count`, %v", want["drain_failure_min_count"]),
		fmt.Sprintf("`connections_alert_ratio`, %v%%", want["connections_alert_ratio"]*100),
	} {
		require.True(t, strings.Contains(string(readme), doc), "terraform/README.md documents the default: %s", doc)
	}

	counter := `metric.type="logging.googleapis.com/user/replication/`
	t.Run("lags", func(t *testing.T) {
		conds := e.conditions("lag")
		require.Len(t, conds, 3)
		for instance, minutes := range map[string]float64{"delivery_stall": num("delivery_lag_alert_minutes"), "verification_lag": num("verification_lag_alert_minutes"),
			"set_aside": num("set_aside_alert_minutes")} {
			var c condition
			for k, v := range conds {
				if strings.HasPrefix(k, instance+"/") {
					c = v
				}
			}
			label := map[string]string{"delivery_stall": "delivery_lag_band", "verification_lag": "verification_lag_band", "set_aside": "set_aside_lag_band"}[instance]
			require.Contains(t, c.filter, counter+`verifier_workspaces"`, instance)
			require.Equal(t, bandsFrom(int(minutes), true), oneOf(t, c.filter, "metric.labels."+label), "%s: the bands over %v minutes", instance, minutes)
			require.Equal(t, "COMPARISON_GT", c.comparison)
			require.Zero(t, c.threshold)
			require.Equal(t, "300s", c.duration, "%s: for five minutes", instance)
			require.Equal(t, []string{"metric.label.workspace"}, c.groupBy, "%s: per workspace", instance)
		}
	})
	t.Run("workspace failing", func(t *testing.T) {
		conds := e.conditions("workspace_failing")
		require.Len(t, conds, 1)
		for _, c := range conds {
			require.Equal(t, []string{delivery.OutcomeFailed}, oneOf(t, c.filter, "metric.labels.outcome"))
			require.Equal(t, num("verifier_failure_passes")-1, c.threshold, "more than passes − 1 failures")
			require.Equal(t, fmt.Sprintf("%vs", num("verifier_failure_passes")*60), c.alignment, "within as many minutes")
			require.Equal(t, "ALIGN_DELTA", c.aligner)
			require.ElementsMatch(t, []string{"metric.label.workspace", "metric.label.cause"}, c.groupBy)
		}
	})
	t.Run("drain failing", func(t *testing.T) {
		conds := e.conditions("drain_failures")
		require.Len(t, conds, 1)
		for _, c := range conds {
			// One PromQL query: the ratio and the minimum volume, on the
			// same workspace, over 10 minutes.
			require.Equal(t, "condition_prometheus_query_language", c.kind)
			q := strings.Join(strings.Fields(c.filter), " ")
			metric := `logging_googleapis_com:user_replication_drain_invocations{monitored_resource="cloud_run_revision"`
			failed := metric + `, outcome=~"failed|unavailable|misconfigured"}[10m]`
			require.Contains(t, q, fmt.Sprintf(`(sum by (workspace) (increase(%s)) / sum by (workspace) (increase(%s}[10m])) > %v)`, failed, metric, num("drain_failure_ratio_alert")))
			require.Contains(t, q, fmt.Sprintf(`and on (workspace) (sum by (workspace) (increase(%s)) >= %v)`, failed, num("drain_failure_min_count")))
		}
	})
	t.Run("verifier passes", func(t *testing.T) {
		absent := e.conditions("verifier")["/no verifier pass"]
		require.Equal(t, "condition_absent", absent.kind)
		require.Equal(t, []string{"ok", "partial_failure"}, oneOf(t, absent.filter, "metric.labels.outcome"),
			"only passes that ran count: not 401, 403 or a misconfigured service")
		require.Equal(t, "600s", absent.duration)
		notReached := e.conditions("verifier_not_reaching")["/workspaces not reached"]
		require.Equal(t, []string{delivery.OutcomeNotReached}, oneOf(t, notReached.filter, "metric.labels.outcome"))
		require.Equal(t, "900s", notReached.duration)
	})
	t.Run("BigQuery subscription", func(t *testing.T) {
		for _, c := range e.conditions("bigquery_subscription") {
			require.Contains(t, c.filter, `subscription/oldest_unacked_message_age"`)
			require.Contains(t, c.filter, `subscription_id=monitoring.regex.full_match(".*-bigquery")`)
			require.Equal(t, num("subscription_backlog_alert_minutes")*60, c.threshold, "the age is in seconds")
		}
		for _, c := range e.conditions("bigquery_write_errors") {
			require.Contains(t, c.filter, `subscription_id=monitoring.regex.full_match(".*-bigquery")`)
			require.Contains(t, c.filter, `metric.labels.response_class!="ack"`)
		}
	})
	t.Run("dead letters", func(t *testing.T) {
		for _, c := range e.conditions("dead_letters") {
			require.Contains(t, c.filter, `subscription_id=monitoring.regex.full_match(".*-dead-letter")`)
			require.Zero(t, c.threshold)
			require.Equal(t, "60s", c.duration)
		}
	})
	t.Run("audit", func(t *testing.T) {
		conds := e.conditions("audit")
		require.Len(t, conds, 2)
		var outcomes []string
		for _, c := range conds {
			outcomes = append(outcomes, oneOf(t, c.filter, "metric.labels.outcome")...)
			require.Zero(t, c.threshold)
		}
		sort.Strings(outcomes)
		require.Equal(t, []string{"differs", "failed"}, outcomes)
	})
	t.Run("SLO", func(t *testing.T) {
		slo := e.m.resources["google_monitoring_slo.verified_in_time"]
		goal, _ := e.value(slo.Body.Attributes["goal"].Expr, nil).AsBigFloat().Float64()
		require.Equal(t, num("slo_goal"), goal)
		var good, total string
		walk(slo.Body, nil, func(name string, expr hclsyntax.Expression, _ []string) {
			switch name {
			case "good_service_filter":
				good = e.value(expr, nil).AsString()
			case "total_service_filter":
				total = e.value(expr, nil).AsString()
			}
		})
		require.Equal(t, bandsFrom(int(num("slo_minutes")), false), oneOf(t, good, "metric.labels.outstanding_band"), "good: within the bound")
		all := []string{delivery.BandUnknown}
		for _, b := range delivery.LagBands() {
			all = append(all, b.Name)
		}
		sort.Strings(all)
		require.Equal(t, all, oneOf(t, total, "metric.labels.outstanding_band"), "total: every sample, a failed workspace's unknown lags too")
		// The SRE workbook's multiwindow, multi-burn-rate alerts: each
		// policy a long and a short window (a twelfth) over one rate, both
		// required (AND), the 1 h and 6 h ones paging, the 3-day one a
		// ticket.
		burn := map[string]map[string]float64{}
		for key, c := range e.conditions("slo_burn") {
			instance, _, _ := strings.Cut(key, "/")
			window := regexp.MustCompile(`"(\d+s)"\)$`).FindStringSubmatch(c.filter)
			require.NotNil(t, window, c.filter)
			if burn[instance] == nil {
				burn[instance] = map[string]float64{}
			}
			burn[instance][window[1]] = c.threshold
		}
		require.Equal(t, map[string]map[string]float64{
			"fast":   {"3600s": 14.4, "300s": 14.4},
			"slow":   {"21600s": 6, "1800s": 6},
			"budget": {"259200s": 1, "21600s": 1},
		}, burn, "the SRE workbook's burn rates and windows")
		policy := e.m.resources["google_monitoring_alert_policy.slo_burn"]
		require.Equal(t, "AND", e.value(policy.Body.Attributes["combiner"].Expr, nil).AsString(), "the long and the short window both burn")
		severity := map[string]string{}
		for k, v := range e.value(e.m.locals["slo_burns"].Expr, nil).AsValueMap() {
			severity[k] = v.GetAttr("severity").AsString()
		}
		require.Equal(t, map[string]string{"fast": "CRITICAL", "slow": "CRITICAL", "budget": "WARNING"}, severity, "1 h and 6 h page, 3 days tickets")
	})
}
