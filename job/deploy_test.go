package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/segmentstream/ontology-replication/functions"
	"github.com/segmentstream/ontology-replication/shared/event"
)

// tfModule is one parsed terraform module directory.
type tfModule struct {
	dir       string
	variables map[string]*hclsyntax.Block
	locals    map[string]bool
	resources map[string]*hclsyntax.Block // "type.name"
	data      map[string]bool             // "type.name"
	modules   map[string]*hclsyntax.Block
	blocks    []*hclsyntax.Block // every top-level block
}

func parseModule(t *testing.T, dir string) *tfModule {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.tf"))
	require.NoError(t, err)
	require.NotEmpty(t, files, dir)
	m := &tfModule{dir: dir, variables: map[string]*hclsyntax.Block{}, locals: map[string]bool{},
		resources: map[string]*hclsyntax.Block{}, data: map[string]bool{}, modules: map[string]*hclsyntax.Block{}}
	p := hclparse.NewParser()
	for _, f := range files {
		file, diags := p.ParseHCLFile(f)
		require.False(t, diags.HasErrors(), "%s: %s", f, diags.Error())
		for _, b := range file.Body.(*hclsyntax.Body).Blocks {
			m.blocks = append(m.blocks, b)
			switch b.Type {
			case "variable":
				m.variables[b.Labels[0]] = b
			case "locals":
				for name := range b.Body.Attributes {
					m.locals[name] = true
				}
			case "resource":
				m.resources[b.Labels[0]+"."+b.Labels[1]] = b
			case "data":
				m.data[b.Labels[0]+"."+b.Labels[1]] = true
			case "module":
				m.modules[b.Labels[0]] = b
			}
		}
	}
	return m
}

// walk calls fn for every attribute expression under body, with the
// dynamic-block iterator names in scope.
func walk(body *hclsyntax.Body, scope []string, fn func(name string, expr hclsyntax.Expression, scope []string)) {
	for name, attr := range body.Attributes {
		fn(name, attr.Expr, scope)
	}
	for _, b := range body.Blocks {
		inner := scope
		if b.Type == "dynamic" {
			inner = append(slices.Clone(scope), b.Labels[0])
		}
		walk(b.Body, inner, fn)
	}
}

func TestTerraformReferencesResolve(t *testing.T) {
	t.Parallel()
	for _, dir := range []string{"../terraform", "../terraform/modules/workspace"} {
		m := parseModule(t, dir)
		for _, b := range m.blocks {
			walk(b.Body, nil, func(attr string, expr hclsyntax.Expression, scope []string) {
				if b.Type == "variable" && attr == "type" {
					return // a type constraint, not references
				}
				for _, tr := range expr.Variables() {
					root := tr.RootName()
					switch root {
					case "path", "each", "count", "self", "terraform":
						return
					case "var":
						require.Contains(t, m.variables, attrName(tr, 1), "%s: var.%s is not declared", dir, attrName(tr, 1))
					case "local":
						require.True(t, m.locals[attrName(tr, 1)], "%s: local.%s is not declared", dir, attrName(tr, 1))
					case "module":
						require.Contains(t, m.modules, attrName(tr, 1), "%s: module.%s is not declared", dir, attrName(tr, 1))
					case "data":
						key := attrName(tr, 1) + "." + attrName(tr, 2)
						require.True(t, m.data[key], "%s: data.%s is not declared", dir, key)
					default:
						if slices.Contains(scope, root) || isForVariable(expr, root) {
							continue
						}
						key := root + "." + attrName(tr, 1)
						require.Contains(t, m.resources, key, "%s: %s is not declared", dir, key)
					}
				}
			})
		}
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

func TestTerraformEnvironmentMatchesTheCode(t *testing.T) {
	t.Parallel()
	m := parseModule(t, "../terraform")
	services := 0
	for key, b := range m.resources {
		switch {
		case strings.HasPrefix(key, "google_cloud_run_v2_service."):
			services++
			env := envOf(t, b)
			require.Contains(t, env, "REPLICATION_WORKSPACES", key)
			target, diags := env["FUNCTION_TARGET"].Value(nil)
			require.False(t, diags.HasErrors(), "%s: FUNCTION_TARGET must be a literal", key)
			require.Contains(t, functions.FunctionNames, target.AsString(), "%s: FUNCTION_TARGET is not a registered function", key)
			for name := range env {
				require.True(t, name == "FUNCTION_TARGET" || slices.Contains(functions.Env, name), "%s sets %s, which the functions do not read", key, name)
			}
		case strings.HasPrefix(key, "google_cloud_run_v2_job."):
			env := envOf(t, b)
			require.Contains(t, env, "REPLICATION_WORKSPACES", key)
			for name := range env {
				require.Contains(t, jobEnv, name, "%s sets %s, which the job does not read", key, name)
			}
		}
	}
	require.Equal(t, 2, services, "the drain and the verifier")
}

func TestTerraformTableSchemaIsTheGoSchema(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../terraform/modules/workspace/events_schema.json")
	require.NoError(t, err)
	var got []event.Field
	require.NoError(t, json.Unmarshal(raw, &got))
	require.Equal(t, event.TableSchema, got, "stale: run go generate ./shared/event")
}

func TestTerraformLeastPrivilege(t *testing.T) {
	t.Parallel()
	root := parseModule(t, "../terraform")
	child := parseModule(t, "../terraform/modules/workspace")
	bound := map[string]bool{}
	for _, m := range []*tfModule{root, child} {
		for key, b := range m.resources {
			walk(b.Body, nil, func(name string, expr hclsyntax.Expression, _ []string) {
				if name == "role" {
					if v, diags := expr.Value(nil); !diags.HasErrors() {
						require.NotContains(t, []string{"roles/owner", "roles/editor"}, v.AsString(), key)
					}
				}
				for _, tr := range expr.Variables() {
					if tr.RootName() == "google_service_account" && (strings.Contains(key, "iam_member") || name == "publishers" || name == "verifier" || name == "job") {
						bound[attrName(tr, 1)] = true
					}
				}
			})
		}
		// Module arguments bind roles too (the workspace module's IAM members).
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
	// The verifier is not publicly invocable.
	for key, b := range root.resources {
		if !strings.HasPrefix(key, "google_cloud_run_v2_service_iam_member.") {
			continue
		}
		refersToVerify := false
		for _, tr := range b.Body.Attributes["name"].Expr.Variables() {
			if tr.RootName() == "google_cloud_run_v2_service" && attrName(tr, 1) == "verify" {
				refersToVerify = true
			}
		}
		if !refersToVerify {
			continue
		}
		member, diags := b.Body.Attributes["member"].Expr.Value(nil)
		if !diags.HasErrors() {
			require.NotContains(t, []string{"allUsers", "allAuthenticatedUsers"}, member.AsString(), "the verifier must stay private")
		}
		require.NotContains(t, b.Body.Attributes, "for_each", "the verifier's invoker is the scheduler only")
	}
}

func TestCloudBuild(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../cloudbuild.yaml")
	require.NoError(t, err)
	var cb struct {
		Steps []struct {
			ID         string   `yaml:"id"`
			Name       string   `yaml:"name"`
			Entrypoint string   `yaml:"entrypoint"`
			Args       []string `yaml:"args"`
		} `yaml:"steps"`
		Images []string `yaml:"images"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &cb))
	require.NotEmpty(t, cb.Steps)
	var paths []string
	for _, s := range cb.Steps {
		require.NotEmpty(t, s.Name, s.ID)
		for _, a := range s.Args {
			for _, field := range strings.Fields(a) {
				field = strings.TrimPrefix(field, "--env=GOOGLE_BUILDABLE=")
				if strings.HasPrefix(field, "./") || strings.HasPrefix(field, ".ci/") {
					paths = append(paths, field)
				}
			}
		}
	}
	require.ElementsMatch(t, []string{".ci/run", "./functions/cmd", "./job"}, paths)
	for _, p := range paths {
		_, err := os.Stat(filepath.Join("..", p))
		require.NoError(t, err, "cloudbuild.yaml names %s", p)
	}
	require.Len(t, cb.Images, 2)
}
