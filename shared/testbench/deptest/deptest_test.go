package deptest_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/segmentstream/ontology-replication/shared/testbench/deptest"
)

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

// TestBannedPackagesExist: every package a layer rule bans exists, so that
// a rename cannot silently disable the rule. (Check does the same for the
// binaries' rules.)
func TestBannedPackagesExist(t *testing.T) {
	t.Parallel()
	for _, banned := range deptest.NoDirectImports {
		for pattern := range banned {
			if missing := deptest.Missing(pattern); missing != "" {
				t.Errorf("banned %s: no such package: %s", pattern, missing)
			}
		}
	}
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
		if got := deptest.Matches(c.pattern, c.pkg); got != c.want {
			t.Errorf("matches(%q, %q) = %v, want %v", c.pattern, c.pkg, got, c.want)
		}
	}
}
