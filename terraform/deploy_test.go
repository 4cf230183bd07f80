package terraform_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/functions"
	"github.com/segmentstream/ontology-replication/shared/config"
	"github.com/segmentstream/ontology-replication/shared/event"
)

// The deploy tests read terraform/ and cloudbuild.yaml offline. This file
// has the module's parsing, its references and the environment the code
// reads; beside it, a file each: the provider's schema (schema_test.go),
// least privilege (privilege_test.go), the build's steps
// (cloudbuild_test.go), the metrics and dashboard (dashboard_test.go), the
// instance budget (budget_test.go), the APIs (apis_test.go), the network
// (network_test.go). (terraform/tests has the plans, which
// offline_test.go runs with schema-only providers.)

// tfModule is one parsed terraform module directory.
type tfModule struct {
	dir       string
	variables map[string]*hclsyntax.Block
	locals    map[string]*hclsyntax.Attribute
	resources map[string]*hclsyntax.Block // "type.name"
	data      map[string]*hclsyntax.Block // "type.name"
	modules   map[string]*hclsyntax.Block
	blocks    []*hclsyntax.Block // every top-level block
	source    map[string][]byte  // file name → contents
}

func parseModule(t *testing.T, dir string) *tfModule {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.tf"))
	require.NoError(t, err)
	require.NotEmpty(t, files, dir)
	m := &tfModule{dir: dir, variables: map[string]*hclsyntax.Block{}, locals: map[string]*hclsyntax.Attribute{},
		resources: map[string]*hclsyntax.Block{}, data: map[string]*hclsyntax.Block{}, modules: map[string]*hclsyntax.Block{},
		source: map[string][]byte{}}
	p := hclparse.NewParser()
	for _, f := range files {
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		m.source[f] = raw
		file, diags := p.ParseHCL(raw, f)
		require.False(t, diags.HasErrors(), "%s: %s", f, diags.Error())
		for _, b := range file.Body.(*hclsyntax.Body).Blocks {
			m.blocks = append(m.blocks, b)
			switch b.Type {
			case "variable":
				m.variables[b.Labels[0]] = b
			case "locals":
				for name, a := range b.Body.Attributes {
					m.locals[name] = a
				}
			case "resource":
				m.resources[b.Labels[0]+"."+b.Labels[1]] = b
			case "data":
				m.data[b.Labels[0]+"."+b.Labels[1]] = b
			case "module":
				m.modules[b.Labels[0]] = b
			}
		}
	}
	return m
}

// walk calls fn for every attribute expression under body, with the
// dynamic-block iterator names in scope. lifecycle's ignore_changes names
// attributes, not references, and is left out.
func walk(body *hclsyntax.Body, scope []string, fn func(name string, expr hclsyntax.Expression, scope []string)) {
	for name, attr := range body.Attributes {
		fn(name, attr.Expr, scope)
	}
	for _, b := range body.Blocks {
		inner := scope
		switch b.Type {
		case "dynamic":
			inner = append(slices.Clone(scope), b.Labels[0])
		case "lifecycle":
			for name, attr := range b.Body.Attributes {
				if name != "ignore_changes" {
					fn(name, attr.Expr, scope)
				}
			}
			for _, inner := range b.Body.Blocks {
				walk(inner.Body, scope, fn)
			}
			continue
		}
		walk(b.Body, inner, fn)
	}
}

// terraformDirs are the modules of the deployment.
var terraformDirs = []string{".", "modules/workspace"}

func TestTerraformReferencesResolve(t *testing.T) {
	t.Parallel()
	for _, dir := range terraformDirs {
		m := parseModule(t, dir)
		require.Empty(t, unresolved(m), dir)
		for name, call := range m.modules {
			source := call.Body.Attributes["source"].Expr.(*hclsyntax.TemplateExpr).Parts[0].(*hclsyntax.LiteralValueExpr).Val.AsString()
			child := parseModule(t, filepath.Join(dir, source))
			for arg := range call.Body.Attributes {
				if arg == "source" || arg == "for_each" || arg == "count" || arg == "depends_on" {
					continue
				}
				require.Contains(t, child.variables, arg, "module %s passes %s, which it does not declare", name, arg)
			}
			for v, b := range child.variables {
				if _, hasDefault := b.Body.Attributes["default"]; !hasDefault {
					require.Contains(t, call.Body.Attributes, v, "module %s needs %s", name, v)
				}
			}
		}
		for name, b := range m.variables {
			require.Contains(t, b.Body.Attributes, "description", "%s: variable %s has no description", dir, name)
			require.Contains(t, b.Body.Attributes, "type", "%s: variable %s has no type", dir, name)
		}
	}
}

// unresolved lists the references of a module that name nothing it
// declares: variables, locals, modules, data sources and resources.
func unresolved(m *tfModule) []string {
	var out []string
	for _, b := range m.blocks {
		if b.Type == "moved" {
			continue
		}
		walk(b.Body, nil, func(attr string, expr hclsyntax.Expression, scope []string) {
			if b.Type == "variable" && attr == "type" {
				return // a type constraint, not references
			}
			if attr == "provider" && (b.Type == "resource" || b.Type == "data") {
				// A provider's local name, which required_providers declares.
				for _, tr := range expr.Variables() {
					if !requiredProviders(m)[tr.RootName()] {
						out = append(out, "provider "+tr.RootName()+" is not in required_providers")
					}
				}
				return
			}
			for _, tr := range expr.Variables() {
				root := tr.RootName()
				var missing string
				switch root {
				case "path", "each", "count", "self", "terraform":
					continue // the next reference of the expression is checked too
				case "var":
					if _, ok := m.variables[attrName(tr, 1)]; !ok {
						missing = "var." + attrName(tr, 1)
					}
				case "local":
					if _, ok := m.locals[attrName(tr, 1)]; !ok {
						missing = "local." + attrName(tr, 1)
					}
				case "module":
					if _, ok := m.modules[attrName(tr, 1)]; !ok {
						missing = "module." + attrName(tr, 1)
					}
				case "data":
					if key := attrName(tr, 1) + "." + attrName(tr, 2); m.data[key] == nil {
						missing = "data." + key
					}
				default:
					if slices.Contains(scope, root) || isForVariable(expr, root) {
						continue
					}
					if key := root + "." + attrName(tr, 1); m.resources[key] == nil {
						missing = key
					}
				}
				if missing != "" {
					out = append(out, missing+" is not declared")
				}
			}
		})
	}
	sort.Strings(out)
	return out
}

// requiredProviders are the local names of a module's required_providers.
func requiredProviders(m *tfModule) map[string]bool {
	names := map[string]bool{}
	for _, b := range m.blocks {
		if b.Type != "terraform" {
			continue
		}
		for _, inner := range b.Body.Blocks {
			if inner.Type == "required_providers" {
				for name := range inner.Body.Attributes {
					names[name] = true
				}
			}
		}
	}
	return names
}

// TestReferenceCheckSeesPastEach is the reference check's own test, on a
// module broken on purpose: every undeclared reference is reported,
// including one after an each. or path. traversal in the same expression
// (an early return once let "${each.key} ${var.no_such}" through), and the
// declared ones, for-expression variables and dynamic-block iterators are
// not.
func TestReferenceCheckSeesPastEach(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.tf"), []byte(`
variable "known" {
  description = "d"
  type        = string
}
locals {
  fine    = [for k in var.known : k]
  after   = "${each.key} ${path.module} ${var.no_such}"
  missing = local.nowhere
}
data "google_project" "p" {}
resource "google_thing" "ok" {
  for_each = toset([var.known])
  name     = "${each.key} ${data.google_project.p.number} ${google_thing.ok["x"].id}"
  other    = module.absent.out
  source   = data.google_nothing.n.id
  peer     = google_other.gone.id
  dynamic "block" {
    for_each = [1]
    content {
      value = block.value
    }
  }
}
resource "google_beta_thing" "b" {
  provider = google-beta
}
`), 0o600))
	got := unresolved(parseModule(t, dir))
	require.Equal(t, []string{
		"data.google_nothing.n is not declared",
		"google_other.gone is not declared",
		"local.nowhere is not declared",
		"module.absent is not declared",
		"provider google-beta is not in required_providers",
		"var.no_such is not declared",
	}, got)
}

func attrName(tr hcl.Traversal, i int) string {
	if i < len(tr) {
		if a, ok := tr[i].(hcl.TraverseAttr); ok {
			return a.Name
		}
	}
	return ""
}

// isForVariable reports whether name is bound by a for expression inside expr.
func isForVariable(expr hclsyntax.Expression, name string) bool {
	found := false
	_ = hclsyntax.VisitAll(expr, func(n hclsyntax.Node) hcl.Diagnostics {
		if f, ok := n.(*hclsyntax.ForExpr); ok && (f.KeyVar == name || f.ValVar == name) {
			found = true
		}
		return nil
	})
	return found
}

// envOf returns the env names and values of a container block's env blocks.
func envOf(t *testing.T, b *hclsyntax.Block) map[string]hclsyntax.Expression {
	out := map[string]hclsyntax.Expression{}
	var visit func(body *hclsyntax.Body)
	visit = func(body *hclsyntax.Body) {
		for _, blk := range body.Blocks {
			if blk.Type == "env" {
				v, diags := blk.Body.Attributes["name"].Expr.Value(nil)
				require.False(t, diags.HasErrors())
				out[v.AsString()] = blk.Body.Attributes["value"].Expr
			}
			visit(blk.Body)
		}
	}
	visit(b.Body)
	return out
}

// TestTerraformEnvironmentMatchesTheCode: each service and the job set
// exactly the variables their component needs, every one of them read by
// the code, FUNCTION_TARGET a registered function.
func TestTerraformEnvironmentMatchesTheCode(t *testing.T) {
	t.Parallel()
	m := parseModule(t, ".")
	want := map[string][]string{
		"google_cloud_run_v2_service.drain":   {"DATABASE_SERVER_MAX_CONNS", "DRAIN_BATCHES_OUT", "DRAIN_GATHER", "FUNCTION_TARGET", "GOOGLE_CLOUD_PROJECT", "LOG_LEVEL", "REPLICATION_WORKSPACES_FILE"},
		"google_cloud_run_v2_service.verify":  {"DATABASE_SERVER_MAX_CONNS", "FUNCTION_TARGET", "GOOGLE_CLOUD_PROJECT", "LOG_LEVEL", "REPLICATION_WORKSPACES_FILE", "VERIFY_AUDIENCE", "VERIFY_CALLER", "VERIFY_TIME_BUDGET", "VERIFY_WORKERS"},
		"google_cloud_run_v2_job.replication": {"DATABASE_SERVER_MAX_CONNS", "GOOGLE_CLOUD_PROJECT", "LOG_LEVEL", "REPLICATION_WORKSPACES_FILE"},
	}
	targets := map[string]string{}
	for key, names := range want {
		b, ok := m.resources[key]
		require.True(t, ok, key)
		env := envOf(t, b)
		var got []string
		for name := range env {
			got = append(got, name)
		}
		sort.Strings(got)
		require.Equal(t, names, got, "%s: the variables its component needs, no more", key)
		for _, name := range got {
			read := functions.Env
			if strings.HasPrefix(key, "google_cloud_run_v2_job.") {
				read = config.JobEnvNames
			}
			require.True(t, name == "FUNCTION_TARGET" || slices.Contains(read, name), "%s sets %s, which the code does not read", key, name)
		}
		if e, ok := env["FUNCTION_TARGET"]; ok {
			v, diags := e.Value(nil)
			require.False(t, diags.HasErrors(), "%s: FUNCTION_TARGET must be a literal", key)
			require.Contains(t, functions.FunctionNames, v.AsString(), key)
			targets[key] = v.AsString()
		}
	}
	require.Equal(t, map[string]string{"google_cloud_run_v2_service.drain": "Drain", "google_cloud_run_v2_service.verify": "Verify"}, targets)
	services := 0
	for key := range m.resources {
		if strings.HasPrefix(key, "google_cloud_run_v2_service.") {
			services++
		}
	}
	require.Equal(t, 2, services, "the drain and the verifier")
}

func TestTerraformTableSchemaIsTheGoSchema(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("modules/workspace/events_schema.json")
	require.NoError(t, err)
	var got []event.Field
	require.NoError(t, json.Unmarshal(raw, &got))
	require.Equal(t, event.TableSchema, got, "stale: run go generate ./shared/event")
}
