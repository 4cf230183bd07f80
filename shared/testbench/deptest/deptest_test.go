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
