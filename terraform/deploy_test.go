package terraform_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/stretchr/testify/require"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
	"gopkg.in/yaml.v3"

	"github.com/segmentstream/ontology-replication/functions"
	"github.com/segmentstream/ontology-replication/shared/config"
	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/event"
)

// The deploy tests read terraform/ and cloudbuild.yaml offline: references,
// the provider's schema, the environment the code reads, least privilege,
// the monitoring's log filters and the build's steps. (terraform/tests has
// the plans, which need the provider installed.)

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
		"google_cloud_run_v2_service.drain":   {"DATABASE_SERVER_MAX_CONNS", "DRAIN_GATHER", "FUNCTION_TARGET", "GOOGLE_CLOUD_PROJECT", "LOG_LEVEL", "REPLICATION_WORKSPACES_FILE"},
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

func TestCloudBuild(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../cloudbuild.yaml")
	require.NoError(t, err)
	var cb struct {
		Timeout string `yaml:"timeout"`
		Steps   []struct {
			ID         string   `yaml:"id"`
			Name       string   `yaml:"name"`
			Entrypoint string   `yaml:"entrypoint"`
			Args       []string `yaml:"args"`
			WaitFor    []string `yaml:"waitFor"`
			Timeout    string   `yaml:"timeout"`
		} `yaml:"steps"`
		Images []string `yaml:"images"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &cb))
	require.NotEmpty(t, cb.Steps)
	// Bounded time: the build's timeout, and every step's within it.
	total, err := time.ParseDuration(cb.Timeout)
	require.NoError(t, err, "cloudbuild.yaml sets a timeout")
	require.LessOrEqual(t, total, 90*time.Minute)
	for _, s := range cb.Steps {
		d, err := time.ParseDuration(s.Timeout)
		require.NoError(t, err, "step %s has a timeout", s.ID)
		require.LessOrEqual(t, d, total, s.ID)
	}
	// Caches: Go's restored before the tests and saved after them, the
	// buildpacks' in a cache image per image.
	require.Contains(t, string(raw), `gs://${_CACHE_BUCKET}/cache/go.tar.gz`)
	require.Contains(t, string(raw), "--cache-image=${_REPOSITORY}/functions-cache:latest")
	require.Contains(t, string(raw), "--cache-image=${_REPOSITORY}/job-cache:latest")
	var paths []string
	pushed := map[string]bool{}
	ids := map[string]bool{}
	for _, s := range cb.Steps {
		require.NotEmpty(t, s.Name, s.ID)
		for _, w := range s.WaitFor {
			require.True(t, ids[w], "step %s waits for %s, which is not an earlier step", s.ID, w)
		}
		ids[s.ID] = true
		if slices.Contains(s.Args, "--publish") {
			pushed[s.Args[1]] = true
		}
		for _, a := range s.Args {
			for _, field := range strings.Fields(a) {
				field = strings.TrimPrefix(field, "--env=GOOGLE_BUILDABLE=")
				if strings.HasPrefix(field, "./") || strings.HasPrefix(field, ".ci/") {
					paths = append(paths, field)
				}
			}
			require.NotRegexp(t, `--image=\S*:\$\{COMMIT_SHA\}`, a, "step %s deploys a tag; the services run digests", s.ID)
		}
	}
	require.ElementsMatch(t, []string{".ci/run", "./functions/cmd", "./job"}, paths)
	for _, p := range paths {
		_, err := os.Stat(filepath.Join("..", p))
		require.NoError(t, err, "cloudbuild.yaml names %s", p)
	}
	require.Len(t, pushed, 2, "both images are pushed by their step")
	for _, image := range cb.Images {
		require.False(t, pushed[image], "%s is pushed by its step (pack --publish) and listed under images:, which makes Cloud Build look for it in its local daemon and fail", image)
	}
}

// providerSchema is a provider's schema as terraform providers schema -json
// writes it (its resources and data sources).
type providerSchema struct {
	Resources   map[string]struct{ Block schemaBlock } `json:"resource_schemas"`
	DataSources map[string]struct{ Block schemaBlock } `json:"data_source_schemas"`
}

func readProviderSchema(t *testing.T, path string) providerSchema {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var schema providerSchema
	require.NoError(t, json.Unmarshal(raw, &schema))
	return schema
}

// TestTerraformMatchesTheProviderSchema checks every resource and data
// block against its provider's schema, as `terraform providers schema
// -json` of each provider recorded it (testdata/README.md): google 7.46,
// google-beta 7.45 and time 0.14. Unknown arguments, computed-only ones
// set, missing required ones, unknown blocks and too many of a block fail.
func TestTerraformMatchesTheProviderSchema(t *testing.T) {
	t.Parallel()
	schema := readProviderSchema(t, "testdata/google-provider-schema.json")
	beta := readProviderSchema(t, "testdata/google-beta-provider-schema.json")
	timeSchema := readProviderSchema(t, "testdata/time-provider-schema.json")
	checked := 0
	for _, dir := range terraformDirs {
		m := parseModule(t, dir)
		for key, b := range m.resources {
			kind := b.Labels[0]
			if kind == "terraform_data" {
				continue // terraform's own
			}
			from := schema
			if p, ok := b.Body.Attributes["provider"]; ok && hcl.ExprAsKeyword(p.Expr) == "google-beta" {
				from = beta
			} else if strings.HasPrefix(kind, "time_") {
				from = timeSchema
			}
			s, ok := from.Resources[kind]
			require.True(t, ok, "%s: %s is not a resource of the provider (or not in the schema's families)", dir, kind)
			checkBlock(t, dir+": "+key, b.Body, s.Block, true)
			checked++
		}
		for key, b := range m.data {
			s, ok := schema.DataSources[b.Labels[0]]
			require.True(t, ok, "%s: data %s", dir, b.Labels[0])
			checkBlock(t, dir+": data."+key, b.Body, s.Block, true)
			checked++
		}
	}
	require.Greater(t, checked, 30)
}

// schemaBlock is a block of terraform's provider schema JSON.
type schemaBlock struct {
	Attributes map[string]struct {
		Required bool `json:"required"`
		Optional bool `json:"optional"`
		Computed bool `json:"computed"`
	} `json:"attributes"`
	BlockTypes map[string]struct {
		NestingMode string      `json:"nesting_mode"`
		MinItems    int         `json:"min_items"`
		MaxItems    int         `json:"max_items"`
		Block       schemaBlock `json:"block"`
	} `json:"block_types"`
}

var metaArguments = map[string]bool{"count": true, "for_each": true, "depends_on": true, "provider": true}

func checkBlock(t *testing.T, at string, body *hclsyntax.Body, s schemaBlock, top bool) {
	t.Helper()
	for name := range body.Attributes {
		if top && metaArguments[name] {
			continue
		}
		a, ok := s.Attributes[name]
		require.True(t, ok, "%s: unknown argument %s", at, name)
		require.True(t, a.Required || a.Optional, "%s: %s is computed only; it cannot be set", at, name)
	}
	for name, a := range s.Attributes {
		if a.Required {
			_, ok := body.Attributes[name]
			require.True(t, ok, "%s: required argument %s is missing", at, name)
		}
	}
	counts := map[string]int{}
	dynamic := map[string]bool{}
	for _, b := range body.Blocks {
		name, content := b.Type, b.Body
		switch {
		case top && (name == "lifecycle" || name == "provisioner" || name == "connection"):
			continue
		case name == "dynamic":
			name, dynamic[b.Labels[0]] = b.Labels[0], true
			for _, c := range b.Body.Blocks {
				if c.Type == "content" {
					content = c.Body
				}
			}
		}
		bt, ok := s.BlockTypes[name]
		require.True(t, ok, "%s: unknown block %s", at, name)
		counts[name]++
		checkBlock(t, at+"."+name, content, bt.Block, false)
	}
	for name, bt := range s.BlockTypes {
		if bt.MaxItems > 0 && !dynamic[name] {
			require.LessOrEqual(t, counts[name], bt.MaxItems, "%s: at most %d %s blocks", at, bt.MaxItems, name)
		}
		if bt.MinItems > 0 && !dynamic[name] {
			require.GreaterOrEqual(t, counts[name], bt.MinItems, "%s: block %s is required", at, name)
		}
	}
}

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

// TestTerraformInstanceBudgetIsTheCodes: terraform's worst case of
// connections on one Cloud SQL instance, evaluated from the HCL for shared
// instances of 1 to 40 workspace databases, is each component's most
// processes × min(its per-server cap, its pool size × the databases) — the
// bound the code enforces (database.Config.ServerMaxConns, a pool per
// workspace) — and each component is given the cap the budget counts, as
// DATABASE_SERVER_MAX_CONNS.
func TestTerraformInstanceBudgetIsTheCodes(t *testing.T) {
	t.Parallel()
	m := parseModule(t, ".")
	components := map[string]string{ // component → its service or job
		"drain": "google_cloud_run_v2_service.drain", "verify": "google_cloud_run_v2_service.verify", "job": "google_cloud_run_v2_job.replication",
	}
	capVar := map[string]string{"drain": "drain_server_max_connections", "verify": "verifier_server_max_connections", "job": "job_server_max_connections"}
	for c, key := range components {
		env := envOf(t, m.resources[key])
		e, ok := env["DATABASE_SERVER_MAX_CONNS"]
		require.True(t, ok, "%s is given its per-server cap", key)
		require.Contains(t, string(e.Range().SliceBytes(m.source[e.Range().Filename])), `local.server_max_conns["`+c+`"]`, key)
	}
	capsExpr := m.locals["server_max_conns"].Expr
	require.NotNil(t, capsExpr)
	caps := string(capsExpr.Range().SliceBytes(m.source[capsExpr.Range().Filename]))
	for c, v := range capVar {
		require.Contains(t, caps, c+" = var."+v)
	}

	funcs := map[string]function.Function{"min": stdlib.MinFunc, "length": stdlib.LengthFunc, "lookup": stdlib.LookupFunc}
	for _, c := range []struct {
		databases                   int
		drainInstances, jobTasks    int
		drainPool, verifyPool, job  int
		drainCap, verifyCap, jobCap int
	}{
		{1, 10, 1, 2, 2, 4, 4, 8, 8},
		{3, 10, 1, 2, 2, 4, 4, 8, 8},
		{40, 10, 2, 2, 2, 4, 4, 8, 8},
		{40, 20, 3, 3, 1, 6, 2, 5, 7},
	} {
		members := make([]cty.Value, c.databases)
		for i := range members {
			members[i] = cty.ObjectVal(map[string]cty.Value{"project": cty.StringVal("acme"), "name": cty.StringVal("shared")})
		}
		num := func(n int) cty.Value { return cty.NumberIntVal(int64(n)) }
		ctx := &hcl.EvalContext{Functions: funcs, Variables: map[string]cty.Value{
			"local": cty.ObjectVal(map[string]cty.Value{"sql_instances": cty.ObjectVal(map[string]cty.Value{"acme:r:shared": cty.TupleVal(members)})}),
			"var": cty.ObjectVal(map[string]cty.Value{
				"drain_max_instances": num(c.drainInstances), "job_tasks": num(c.jobTasks),
				"drain_pool_size": num(c.drainPool), "verifier_pool_size": num(c.verifyPool), "job_pool_size": num(c.job),
				"drain_server_max_connections": num(c.drainCap), "verifier_server_max_connections": num(c.verifyCap), "job_server_max_connections": num(c.jobCap),
			}),
		}}
		got, diags := m.locals["instance_connections"].Expr.Value(ctx)
		require.False(t, diags.HasErrors(), diags.Error())
		n, _ := got.GetAttr("acme:r:shared").AsBigFloat().Int64()
		// The verifier runs as one instance (services.tf).
		want := c.drainInstances*min(c.drainCap, c.drainPool*c.databases) + 1*min(c.verifyCap, c.verifyPool*c.databases) + c.jobTasks*min(c.jobCap, c.job*c.databases)
		require.EqualValues(t, want, n, "%+v", c)
	}
	// Each process's pool per workspace, in the registry the component
	// reads (max_conns), is the pool size the budget counts.
	poolVars := map[string]int{"drain_pool_size": 2, "verifier_pool_size": 3, "job_pool_size": 5}
	vars := map[string]cty.Value{}
	for k, v := range poolVars {
		vars[k] = cty.NumberIntVal(int64(v))
	}
	pools, diags := m.locals["pool_size"].Expr.Value(&hcl.EvalContext{Variables: map[string]cty.Value{"var": cty.ObjectVal(vars)}})
	require.False(t, diags.HasErrors(), diags.Error())
	for c, v := range map[string]string{"drain": "drain_pool_size", "verify": "verifier_pool_size", "job": "job_pool_size"} {
		n, _ := pools.GetAttr(c).AsBigFloat().Int64()
		require.EqualValues(t, poolVars[v], n, "the %s pool the budget counts", c)
	}
	registryExpr := m.locals["registry"].Expr
	registrySource := string(registryExpr.Range().SliceBytes(m.source[registryExpr.Range().Filename]))
	require.Regexp(t, `max_conns\s*=\s*local\.pool_size\[c\]\s*\n`, registrySource, "the registry's max_conns is the budget's pool size")
	require.Equal(t, 1, strings.Count(registrySource, "max_conns"))

	for name, def := range map[string]int{"drain_server_max_connections": 4, "verifier_server_max_connections": database.DefaultServerMaxConns, "job_server_max_connections": database.DefaultServerMaxConns} {
		v, diags := m.variables[name].Body.Attributes["default"].Expr.Value(nil)
		require.False(t, diags.HasErrors())
		got, _ := v.AsBigFloat().Int64()
		require.EqualValues(t, def, got, name)
	}
}

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

// TestTerraformPrivateIPNeedsANetwork evaluates the network precondition
// as terraform would: a workspace on its database's private IP (the
// default) with no vpc_network is refused, naming it; with a network, or
// with every workspace on public IPs, it passes. Every component waits for
// the check.
func TestTerraformPrivateIPNeedsANetwork(t *testing.T) {
	t.Parallel()
	m := parseModule(t, ".")
	check := m.resources["terraform_data.network"]
	require.NotNil(t, check)
	var cond, msg hclsyntax.Expression
	for _, b := range check.Body.Blocks {
		for _, p := range b.Body.Blocks {
			if p.Type == "precondition" {
				cond, msg = p.Body.Attributes["condition"].Expr, p.Body.Attributes["error_message"].Expr
			}
		}
	}
	require.NotNil(t, cond)
	funcs := map[string]function.Function{"length": stdlib.LengthFunc, "sort": stdlib.SortFunc, "join": stdlib.JoinFunc}
	for _, c := range []struct {
		name      string
		private   map[string]bool
		network   string
		ok        bool
		mentioned string
	}{
		{"private, no network", map[string]bool{"w1": true, "w2": false}, "", false, "w1"},
		{"private, a network", map[string]bool{"w1": true}, "projects/acme/global/networks/default", true, ""},
		{"public only", map[string]bool{"w1": false, "w2": false}, "", true, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			workspaces := map[string]cty.Value{}
			for id, private := range c.private {
				workspaces[id] = cty.ObjectVal(map[string]cty.Value{"database": cty.ObjectVal(map[string]cty.Value{"private_ip": cty.BoolVal(private)})})
			}
			vars := map[string]cty.Value{"workspaces": cty.ObjectVal(workspaces), "vpc_network": cty.StringVal(c.network)}
			ctx := &hcl.EvalContext{Functions: funcs, Variables: map[string]cty.Value{"var": cty.ObjectVal(vars)}}
			private, diags := m.locals["private_ip_workspaces"].Expr.Value(ctx)
			require.False(t, diags.HasErrors(), diags.Error())
			ctx.Variables["local"] = cty.ObjectVal(map[string]cty.Value{"private_ip_workspaces": private})
			ok, diags := cond.Value(ctx)
			require.False(t, diags.HasErrors(), diags.Error())
			require.Equal(t, c.ok, ok.True())
			if !c.ok {
				text, diags := msg.Value(ctx)
				require.False(t, diags.HasErrors(), diags.Error())
				require.Contains(t, text.AsString(), "Workspaces "+c.mentioned+" reach")
				require.Contains(t, text.AsString(), "set vpc_network")
			}
		})
	}
	for _, key := range []string{"google_cloud_run_v2_service.drain", "google_cloud_run_v2_service.verify", "google_cloud_run_v2_job.replication"} {
		deps := m.resources[key].Body.Attributes["depends_on"]
		require.NotNil(t, deps, key)
		require.Contains(t, string(deps.Expr.Range().SliceBytes(m.source[deps.Expr.Range().Filename])), "terraform_data.network", key)
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
