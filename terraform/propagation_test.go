package terraform_test

import (
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/stretchr/testify/require"
)

// TestTerraformMakesThePubSubAgentBeforeItsGrants: on a brand-new project
// the Pub/Sub service agent may not exist yet; every grant to it waits for
// google_project_service_identity, and the BigQuery subscription, which
// Pub/Sub checks against the agent's roles when it is created, waits for
// the grants to propagate (time_sleep after every grant made before it).
func TestTerraformMakesThePubSubAgentBeforeItsGrants(t *testing.T) {
	t.Parallel()
	m := parseModule(t, "modules/workspace")
	identity, ok := m.resources["google_project_service_identity.pubsub"]
	require.True(t, ok, "the agent is made by the module")
	require.Equal(t, `"pubsub.googleapis.com"`, exprSource(m, identity.Body.Attributes["service"].Expr))
	require.Equal(t, "var.pubsub_project", exprSource(m, identity.Body.Attributes["project"].Expr))
	require.Equal(t, "google-beta", exprSource(m, identity.Body.Attributes["provider"].Expr))

	wait := exprSource(m, m.resources["time_sleep.agent_grants"].Body.Attributes["triggers"].Expr)
	grants := 0
	for key, b := range m.resources {
		member, ok := b.Body.Attributes["member"]
		if !ok || exprSource(m, member.Expr) != "local.pubsub_agent" {
			continue
		}
		grants++
		require.Contains(t, dependsOn(m, b.Body), "google_project_service_identity.pubsub", "%s grants the agent before it exists", key)
		if !strings.Contains(attrSource(m, b.Body, "subscription"), "google_pubsub_subscription.bigquery") {
			require.Contains(t, wait, strings.TrimSuffix(key, "[each.key]"), "%s: the subscription does not wait for it", key)
		}
	}
	require.Equal(t, 3, grants, "the dataset's two roles, the dead-letter topic's and the subscription's")
	require.Contains(t, dependsOn(m, m.resources["google_pubsub_subscription.bigquery"].Body), "time_sleep.agent_grants")
}

// TestTerraformServicesWaitForTheirGrants: the services and the job read
// their registry secret and log in to Cloud SQL as soon as their first
// revision starts; they wait for those grants to propagate.
func TestTerraformServicesWaitForTheirGrants(t *testing.T) {
	t.Parallel()
	m := parseModule(t, ".")
	triggers := exprSource(m, m.resources["time_sleep.grants"].Body.Attributes["triggers"].Expr)
	require.Contains(t, triggers, "google_secret_manager_secret_iam_member.registry")
	require.Contains(t, triggers, "google_project_iam_member.cloudsql")
	for _, key := range []string{"google_cloud_run_v2_service.drain", "google_cloud_run_v2_service.verify", "google_cloud_run_v2_job.replication"} {
		require.Contains(t, dependsOn(m, m.resources[key].Body), "time_sleep.grants", key)
	}
}

// exprSource is an expression's text as written.
func exprSource(m *tfModule, expr hclsyntax.Expression) string {
	r := expr.Range()
	return string(r.SliceBytes(m.source[r.Filename]))
}

// attrSource is the text of a block's attribute ("" without it).
func attrSource(m *tfModule, body *hclsyntax.Body, name string) string {
	if a, ok := body.Attributes[name]; ok {
		return exprSource(m, a.Expr)
	}
	return ""
}

// dependsOn is the text of a block's depends_on ("" without one).
func dependsOn(m *tfModule, body *hclsyntax.Body) string { return attrSource(m, body, "depends_on") }
