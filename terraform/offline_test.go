package terraform_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// offlineProviders are the providers terraform/ requires, at the versions
// whose schemas testdata records.
var offlineProviders = []struct{ name, version string }{{"google", "7.46.0"}, {"google-beta", "7.45.0"}, {"time", "0.14.0"}}

// TestTerraformRunsOffline runs `terraform init`, `terraform validate` and
// `terraform test` on a copy of terraform/, on a machine that cannot
// download providers: each provider is the schema-only provider
// (shared/testbench/schemaprovider) serving that provider's recorded
// schema, installed from a filesystem mirror made here, so that
// `mock_provider` plans with the real providers' schemas. Where terraform
// is not installed it is skipped, saying so; Cloud Build runs the same
// tests against the real providers.
func TestTerraformRunsOffline(t *testing.T) {
	env := offlineTerraform(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	work := filepath.Join(t.TempDir(), "terraform")
	copyModule(t, ".", work)
	for _, args := range [][]string{{"init", "-backend=false", "-input=false", "-no-color"}, {"validate", "-no-color"}, {"test", "-no-color"}} {
		out, err := env.run(ctx, work, args...)
		require.NoError(t, err, "terraform %s:\n%s", args[0], out)
		if args[0] == "test" {
			require.Contains(t, out, "Success!", "terraform test:\n%s", out)
			require.NotContains(t, out, "skip", "no run skipped:\n%s", out)
			t.Logf("terraform test: %s", lastLine(out))
		}
	}
}

// TestTheOfflineProviderRefusesWhatTheRealOneRefuses: `terraform
// validate` against the schema-only provider refuses each mistake the real
// provider's schema refuses (a required argument missing, at the top or in
// a block; an argument the resource has not; a value of the wrong type;
// an attribute only the provider sets; too many or too few blocks), and
// passes the same resources written right. A schema that lost a rule in
// its conversion would let terraform/ pass offline with that mistake in it.
func TestTheOfflineProviderRefusesWhatTheRealOneRefuses(t *testing.T) {
	env := offlineTerraform(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	work := t.TempDir()
	const providers = `terraform {
  required_providers {
    google = { source = "hashicorp/google", version = "7.46.0" }
  }
}
`
	write := func(body string) {
		require.NoError(t, os.WriteFile(filepath.Join(work, "main.tf"), []byte(providers+body), 0o644))
	}
	write("")
	out, err := env.run(ctx, work, "init", "-backend=false", "-input=false", "-no-color")
	require.NoError(t, err, "terraform init:\n%s", out)
	const policy = `resource "google_monitoring_alert_policy" "p" {
  display_name = "p"
  combiner     = "OR"
%s}
`
	const condition = `  conditions {
    display_name = "c"
    condition_absent {
      duration = "60s"
    }
  }
`
	for _, c := range []struct {
		name, body, refusal string // refusal "": validate passes
	}{
		{"written right", `resource "google_pubsub_topic" "t" {
  name   = "t"
  labels = { team = "data" }
  message_storage_policy {
    allowed_persistence_regions = ["europe-west1"]
  }
}
resource "google_service_account" "a" {
  account_id = "a"
}
` + fmt.Sprintf(policy, condition), ""},
		{"a required argument missing", `resource "google_pubsub_topic" "t" {}`, "Missing required argument"},
		{"a required argument of a block missing", `resource "google_pubsub_topic" "t" {
  name = "t"
  message_storage_policy {}
}`, "Missing required argument"},
		{"an argument the resource has not", `resource "google_pubsub_topic" "t" {
  name  = "t"
  bogus = "x"
}`, "Unsupported argument"},
		{"a value of the wrong type", `resource "google_pubsub_topic" "t" {
  name   = "t"
  labels = ["data"]
}`, "Incorrect attribute value type"},
		{"an attribute only the provider sets", `resource "google_service_account" "a" {
  account_id = "a"
  email      = "a@example.com"
}`, "Value for unconfigurable attribute"},
		{"more blocks than the resource takes", `resource "google_pubsub_topic" "t" {
  name = "t"
  message_storage_policy {
    allowed_persistence_regions = ["europe-west1"]
  }
  message_storage_policy {
    allowed_persistence_regions = ["europe-west4"]
  }
}`, "Too many message_storage_policy blocks"},
		{"fewer blocks than the resource needs", fmt.Sprintf(policy, ""), "Insufficient conditions blocks"},
	} {
		t.Run(c.name, func(t *testing.T) {
			write(c.body)
			out, err := env.run(ctx, work, "validate", "-no-color")
			if c.refusal == "" {
				require.NoError(t, err, "terraform validate:\n%s", out)
				return
			}
			require.Error(t, err, "terraform validate passed:\n%s", out)
			require.Contains(t, out, c.refusal)
		})
	}
}

// offlineEnv runs terraform with providers installed from a filesystem
// mirror of the schema-only provider.
type offlineEnv []string

// offlineTerraform makes a filesystem mirror of the schema-only provider
// (shared/testbench/schemaprovider) serving each provider's recorded
// schema, and returns the environment that installs providers from it,
// so that terraform plans with the real providers' schemas on a machine
// that cannot download them. Where terraform is not installed the test is
// skipped, saying so; Cloud Build runs the same tests against the real
// providers.
func offlineTerraform(t *testing.T) offlineEnv {
	t.Helper()
	if _, err := exec.LookPath("terraform"); err != nil {
		t.Skip("terraform is not installed: terraform validate and terraform test not run")
	}
	dir := t.TempDir()
	mirror := filepath.Join(dir, "mirror")
	binary := filepath.Join(dir, "schemaprovider")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", binary, "github.com/segmentstream/ontology-replication/shared/testbench/schemaprovider")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build the schema-only provider: %s", out)
	for _, p := range offlineProviders {
		to := filepath.Join(mirror, "registry.terraform.io", "hashicorp", p.name, p.version, "linux_amd64")
		require.NoError(t, os.MkdirAll(to, 0o755))
		require.NoError(t, os.Link(binary, filepath.Join(to, fmt.Sprintf("terraform-provider-%s_v%s", p.name, p.version))))
	}
	config := filepath.Join(dir, "cli.tfrc")
	require.NoError(t, os.WriteFile(config, []byte(fmt.Sprintf(`provider_installation {
  filesystem_mirror {
    path    = %q
    include = ["registry.terraform.io/hashicorp/*"]
  }
  direct {
    exclude = ["registry.terraform.io/hashicorp/*"]
  }
}
`, mirror)), 0o644))
	testdata, err := filepath.Abs("testdata")
	require.NoError(t, err)
	return append(os.Environ(), "TF_CLI_CONFIG_FILE="+config, "SCHEMA_PROVIDER_DIR="+testdata, "CHECKPOINT_DISABLE=1", "TF_IN_AUTOMATION=1",
		"TF_PLUGIN_CACHE_DIR=")
}

// run runs terraform with args in dir, returning its combined output.
func (env offlineEnv) run(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "terraform", args...)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// copyModule copies terraform/'s HCL, tests and templates (not its state,
// lock file or .terraform) to dst.
func copyModule(t *testing.T, src, dst string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			if rel == ".terraform" || rel == "testdata" {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if strings.HasSuffix(rel, ".go") || strings.HasPrefix(filepath.Base(rel), "terraform.tfstate") || rel == ".terraform.lock.hcl" {
			return nil
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), raw, 0o644)
	}))
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestTerraformProviderFloorIsTested: the google providers' floor in
// versions.tf is no lower than the oldest version the tests run (an older
// provider may lack an argument the module sets).
func TestTerraformProviderFloorIsTested(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("versions.tf")
	require.NoError(t, err)
	floors := regexp.MustCompile(`(?s)(google(?:-beta)?) = \{[^}]*?version\s*=\s*">= (\d+)\.(\d+)`).FindAllStringSubmatch(string(raw), -1)
	require.Len(t, floors, 2, "google and google-beta")
	for _, f := range floors {
		var tested string
		for _, p := range offlineProviders {
			if p.name == f[1] {
				tested = p.version
			}
		}
		require.NotEmpty(t, tested, f[1])
		var major, minor, testedMajor, testedMinor int
		_, err := fmt.Sscanf(f[2]+"."+f[3], "%d.%d", &major, &minor)
		require.NoError(t, err)
		_, err = fmt.Sscanf(tested, "%d.%d", &testedMajor, &testedMinor)
		require.NoError(t, err)
		require.Equal(t, testedMajor, major, f[1])
		// The oldest version tested anywhere: 7.45 (google-beta here,
		// google in terraform/tests' Cloud Build step).
		require.GreaterOrEqual(t, minor, 45, "%s: floor %d.%d is older than any version tested", f[1], major, minor)
		require.LessOrEqual(t, minor, testedMinor, "%s: floor %d.%d is newer than the version tested, %s", f[1], major, minor, tested)
	}
}
