package terraform_test

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/stretchr/testify/require"
)

// dependsOnAPIs lists the root module's resources and module calls that
// terraform may create before the APIs are enabled: those that reach
// google_project_service.enabled through no reference or depends_on,
// directly or through what they reference (locals included). Resources that
// call no Google API (terraform_data) are left out.
func dependsOnAPIs(m *tfModule) []string {
	const apis = "google_project_service.enabled"
	edges := map[string][]string{}
	add := func(node string, body *hclsyntax.Body) {
		walk(body, nil, func(_ string, expr hclsyntax.Expression, _ []string) {
			for _, tr := range expr.Variables() {
				switch root := tr.RootName(); root {
				case "var", "path", "each", "count", "self", "terraform":
				case "local", "module":
					edges[node] = append(edges[node], root+"."+attrName(tr, 1))
				case "data":
					edges[node] = append(edges[node], "data."+attrName(tr, 1)+"."+attrName(tr, 2))
				default:
					edges[node] = append(edges[node], root+"."+attrName(tr, 1))
				}
			}
		})
	}
	for name, a := range m.locals {
		body := &hclsyntax.Body{Attributes: hclsyntax.Attributes{name: a}}
		add("local."+name, body)
	}
	for key, b := range m.resources {
		add(key, b.Body)
	}
	for key, b := range m.data {
		add("data."+key, b.Body)
	}
	for key, b := range m.modules {
		add("module."+key, b.Body)
	}
	reaches := func(from string) bool {
		seen := map[string]bool{}
		stack := []string{from}
		for len(stack) > 0 {
			n := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if n == apis {
				return true
			}
			if seen[n] {
				continue
			}
			seen[n] = true
			stack = append(stack, edges[n]...)
		}
		return false
	}
	var out []string
	for key := range m.resources {
		if key == apis || strings.HasPrefix(key, "terraform_data.") {
			continue
		}
		if !reaches(key) {
			out = append(out, key)
		}
	}
	for key := range m.modules {
		if !reaches("module." + key) {
			out = append(out, "module."+key)
		}
	}
	sort.Strings(out)
	return out
}

// TestTerraformWaitsForItsAPIs: on a fresh project the first apply must
// not race the enablement of the APIs: every resource and module of the
// deployment is created after google_project_service.enabled, through a
// depends_on or a reference to something that is. The check itself is
// tried on a module broken on purpose.
func TestTerraformWaitsForItsAPIs(t *testing.T) {
	t.Parallel()
	require.Empty(t, dependsOnAPIs(parseModule(t, ".")), "these do not wait for the APIs: add depends_on = [google_project_service.enabled]")

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.tf"), []byte(`
resource "google_project_service" "enabled" {
  service = "x"
}
resource "google_service_account" "direct" {
  depends_on = [google_project_service.enabled]
}
locals {
  email = google_service_account.direct.email
}
resource "google_project_iam_member" "through_a_local" {
  member = local.email
}
resource "google_project_iam_custom_role" "alone" {
  role_id = "r"
}
module "child" {
  source = "./child"
}
resource "terraform_data" "check" {}
`), 0o600))
	require.Equal(t, []string{"google_project_iam_custom_role.alone", "module.child"}, dependsOnAPIs(parseModule(t, dir)))
}
