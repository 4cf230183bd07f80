package terraform_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/stretchr/testify/require"
)

// allowedRoles are every role the deployment grants, anywhere: a literal, a
// for_each set, a module argument. A role not listed fails the test.
var allowedRoles = map[string]string{
	"roles/artifactregistry.writer":      "the build pushes images",
	"roles/bigquery.dataEditor":          "the Pub/Sub agent writes the events table",
	"roles/bigquery.dataViewer":          "the verifier reads the events table",
	"roles/bigquery.jobUser":             "the verifier's lookups and the job's view statements",
	"roles/bigquery.metadataViewer":      "the Pub/Sub agent reads the table's schema",
	"roles/cloudsql.client":              "connect to the workspace's instance",
	"roles/monitoring.metricWriter":      "the Cloud SQL connector exports its own metrics to the instance's project",
	"roles/cloudsql.instanceUser":        "IAM database login",
	"roles/iam.serviceAccountUser":       "the build deploys revisions running as the components",
	"roles/logging.logWriter":            "the build's logs",
	"roles/pubsub.publisher":             "the components publish; the Pub/Sub agent dead-letters",
	"roles/pubsub.subscriber":            "the Pub/Sub agent reads the subscription; the job reads dead letters",
	"roles/run.developer":                "the build rolls the services forward",
	"roles/run.invoker":                  "the scheduler invokes the verifier and runs the scheduled audit's job; the gateway the drain",
	"roles/secretmanager.secretAccessor": "each component reads its registry",
	"roles/storage.objectUser":           "the build's uploaded sources",
}

var roleLiteral = regexp.MustCompile(`"(roles/[A-Za-z0-9._]+)"`)

// TestTerraformLeastPrivilege: every role in the HCL is one the deployment
// needs (whatever the expression it is in), no binding or policy resource
// replaces a role's other members, every service account has a binding,
// only the drain turns the invoker check off, and the verifier is private.
func TestTerraformLeastPrivilege(t *testing.T) {
	t.Parallel()
	root := parseModule(t, ".")
	child := parseModule(t, "modules/workspace")
	for _, m := range []*tfModule{root, child} {
		for file, raw := range m.source {
			for _, match := range roleLiteral.FindAllStringSubmatch(string(raw), -1) {
				_, ok := allowedRoles[match[1]]
				require.True(t, ok, "%s grants %s, which is not on the allowed list", file, match[1])
			}
		}
		for key := range m.resources {
			require.False(t, strings.HasSuffix(strings.SplitN(key, ".", 2)[0], "_iam_binding") || strings.HasSuffix(strings.SplitN(key, ".", 2)[0], "_iam_policy"),
				"%s: a binding or policy resource replaces the role's other members; grant with _iam_member", key)
		}
		// Custom roles: only the views role, with only the permissions views need.
		for key, b := range m.resources {
			if !strings.HasPrefix(key, "google_project_iam_custom_role.") {
				continue
			}
			v, diags := b.Body.Attributes["permissions"].Expr.Value(nil)
			require.False(t, diags.HasErrors())
			var perms []string
			for _, p := range v.AsValueSlice() {
				perms = append(perms, p.AsString())
			}
			require.ElementsMatch(t, []string{"bigquery.datasets.get", "bigquery.tables.create", "bigquery.tables.get", "bigquery.tables.list", "bigquery.tables.update"}, perms,
				"%s: no delete, no data access", key)
		}
	}
	bound := map[string]bool{}
	for _, m := range []*tfModule{root, child} {
		// The accounts a local refers to (local.build_member).
		viaLocal := map[string][]string{}
		for name, a := range m.locals {
			for _, tr := range a.Expr.Variables() {
				if tr.RootName() == "google_service_account" {
					viaLocal[name] = append(viaLocal[name], attrName(tr, 1))
				}
			}
		}
		for key, b := range m.resources {
			grants := strings.Contains(key, "iam_member") || strings.HasPrefix(key, "google_sql_user.") || strings.HasPrefix(key, "google_cloud_scheduler_job.")
			walk(b.Body, nil, func(name string, expr hclsyntax.Expression, _ []string) {
				for _, tr := range expr.Variables() {
					switch {
					case !grants:
					case tr.RootName() == "google_service_account":
						bound[attrName(tr, 1)] = true
					case tr.RootName() == "local":
						for _, sa := range viaLocal[attrName(tr, 1)] {
							bound[sa] = true
						}
					}
				}
			})
		}
		for _, call := range m.modules {
			walk(call.Body, nil, func(name string, expr hclsyntax.Expression, _ []string) {
				for _, tr := range expr.Variables() {
					if tr.RootName() == "google_service_account" {
						bound[attrName(tr, 1)] = true
					}
				}
			})
		}
	}
	for key := range root.resources {
		if name, ok := strings.CutPrefix(key, "google_service_account."); ok {
			require.True(t, bound[name], "service account %s has no role binding", name)
		}
	}
	for key, b := range root.resources {
		if _, ok := b.Body.Attributes["invoker_iam_disabled"]; ok {
			require.Equal(t, "google_cloud_run_v2_service.drain", key, "only the drain, which checks every call's token, may turn the invoker check off")
		}
		if member, ok := b.Body.Attributes["member"]; ok {
			if v, diags := member.Expr.Value(nil); !diags.HasErrors() {
				require.NotContains(t, []string{"allUsers", "allAuthenticatedUsers"}, v.AsString(), "%s: no public binding", key)
			}
		}
	}
	verify := root.resources["google_cloud_run_v2_service.verify"]
	ingress, diags := verify.Body.Attributes["ingress"].Expr.Value(nil)
	require.False(t, diags.HasErrors())
	require.Equal(t, "INGRESS_TRAFFIC_INTERNAL_ONLY", ingress.AsString(), "the verifier is private")
	invoker := root.resources["google_cloud_run_v2_service_iam_member.verify_invoker"]
	require.NotContains(t, invoker.Body.Attributes, "for_each", "the verifier's invoker is the scheduler only")
	for _, tr := range invoker.Body.Attributes["member"].Expr.Variables() {
		require.Equal(t, "google_service_account", tr.RootName())
		require.Equal(t, "scheduler", attrName(tr, 1))
	}
}

// TestTerraformViewsRoleIsNotOnTheEventsDataset: the job's custom views
// role (which holds bigquery.tables.update, and so could set the events
// table's expiration) is granted on the views dataset only; on the events
// dataset the job only reads; the views dataset is authorized on it; and a
// workspace whose views_dataset is its dataset is refused.
func TestTerraformViewsRoleIsNotOnTheEventsDataset(t *testing.T) {
	t.Parallel()
	child := parseModule(t, "modules/workspace")
	text := func(e hclsyntax.Expression) string {
		return string(e.Range().SliceBytes(child.source[e.Range().Filename]))
	}
	var viewsRole []string
	for key, b := range child.resources {
		if !strings.HasPrefix(key, "google_bigquery_dataset_iam_member.") {
			continue
		}
		role, dataset := text(b.Body.Attributes["role"].Expr), text(b.Body.Attributes["dataset_id"].Expr)
		if role == "var.job_role_id" {
			viewsRole = append(viewsRole, key)
			require.Equal(t, "google_bigquery_dataset.views.dataset_id", dataset, "%s: the views role on the views dataset only", key)
		}
		if strings.Contains(dataset, "google_bigquery_dataset.internal") && text(b.Body.Attributes["member"].Expr) == "var.job" {
			require.Equal(t, `"roles/bigquery.dataViewer"`, role, "%s: on the events dataset the job only reads", key)
		}
	}
	require.Equal(t, []string{"google_bigquery_dataset_iam_member.job"}, viewsRole)
	access := child.resources["google_bigquery_dataset_access.views"]
	require.NotNil(t, access, "the views dataset is authorized on the events dataset")
	require.Equal(t, "google_bigquery_dataset.internal.dataset_id", text(access.Body.Attributes["dataset_id"].Expr))

	root := parseModule(t, ".")
	var refused bool
	for _, b := range root.variables["workspaces"].Body.Blocks {
		if b.Type == "validation" {
			cond := b.Body.Attributes["condition"].Expr
			refused = refused || strings.Contains(string(cond.Range().SliceBytes(root.source[cond.Range().Filename])), "ws.views_dataset != ws.dataset")
		}
	}
	require.True(t, refused, "views_dataset equal to dataset is refused")
}
