package deptest_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/segmentstream/ontology-replication/shared/testbench/deptest"
)

// TestDeployedBinariesLinkNoBench lists each deployed binary's packages and
// fails on any that only tests and the local mode may use.
func TestDeployedBinariesLinkNoBench(t *testing.T) {
	t.Parallel()
	for bin, extra := range deptest.Binaries {
		t.Run(bin, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", bin)
			cmd.Dir = "../../.."
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("go list -deps %s: %v", bin, err)
			}
			deps := strings.Fields(string(out))
			if len(deps) < 10 {
				t.Fatalf("go list -deps %s listed only %v", bin, deps)
			}
			for _, dep := range deps {
				for pattern, why := range merge(deptest.BadDeps, extra) {
					if matches(pattern, dep) {
						t.Errorf("%s links %s: %s", bin, dep, why)
					}
				}
			}
		})
	}
}

// TestLayerBoundaries lists each package's direct imports and fails on one
// that NoDirectImports bans.
func TestLayerBoundaries(t *testing.T) {
	t.Parallel()
	for pkg, banned := range deptest.NoDirectImports {
		cmd := exec.Command("go", "list", "-f", "{{join .Imports \" \"}}", pkg)
		cmd.Dir = "../../.."
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		imports := strings.Fields(string(out))
		if len(imports) == 0 {
			t.Fatalf("go list %s listed no imports", pkg)
		}
		for _, imp := range imports {
			if why, ok := banned[imp]; ok {
				t.Errorf("%s imports %s: %s", pkg, imp, why)
			}
		}
	}
}

// TestBannedPackagesExist: every package a rule bans exists, so that a
// rename cannot silently disable the rule (a ban of a package that is
// gone bans nothing).
func TestBannedPackagesExist(t *testing.T) {
	t.Parallel()
	var patterns []string
	for pattern := range deptest.BadDeps {
		patterns = append(patterns, pattern)
	}
	for _, extra := range deptest.Binaries {
		for pattern := range extra {
			patterns = append(patterns, pattern)
		}
	}
	for _, banned := range deptest.NoDirectImports {
		for pattern := range banned {
			patterns = append(patterns, pattern)
		}
	}
	for _, pattern := range patterns {
		// Each package the pattern names, or "missing: <error>".
		cmd := exec.Command("go", "list", "-e", "-f", "{{if .Error}}missing: {{.Error}}{{else}}{{.ImportPath}}{{end}}", pattern)
		cmd.Dir = "../../.."
		out, err := cmd.CombinedOutput()
		if err != nil || len(strings.Fields(string(out))) == 0 || strings.Contains(string(out), "missing: ") || strings.Contains(string(out), "matched no packages") {
			t.Errorf("banned %s: no such package (%v): %s", pattern, err, out)
		}
	}
}

func merge(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

func matches(pattern, pkg string) bool {
	if tree, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == tree || strings.HasPrefix(pkg, tree+"/")
	}
	return pkg == pattern
}

// TestMatches checks the pattern rule the test relies on.
func TestMatches(t *testing.T) {
	for _, c := range []struct {
		pattern, pkg string
		want         bool
	}{
		{"a/b/...", "a/b", true},
		{"a/b/...", "a/b/c", true},
		{"a/b/...", "a/bc", false},
		{"a/b", "a/b/c", false},
		{"testing", "testing", true},
	} {
		if got := matches(c.pattern, c.pkg); got != c.want {
			t.Errorf("matches(%q, %q) = %v, want %v", c.pattern, c.pkg, got, c.want)
		}
	}
}
