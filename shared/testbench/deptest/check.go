package deptest

import (
	"os/exec"
	"strings"
	"testing"
)

// Check fails t when the main package pkg (a directory, such as ".": the
// caller's own) links a package of BadDeps or of Binaries[name], or when a
// package one of those rules bans no longer exists (a ban of a renamed
// package would ban nothing). Each deployed binary's own test calls it.
func Check(t *testing.T, name, pkg string) {
	t.Helper()
	extra, ok := Binaries[name]
	if !ok {
		t.Fatalf("deptest: %s is not a deployed binary (Binaries)", name)
	}
	rules := map[string]string{}
	for k, v := range BadDeps {
		rules[k] = v
	}
	for k, v := range extra {
		rules[k] = v
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps %s listed only %v", pkg, deps)
	}
	for _, dep := range deps {
		for pattern, why := range rules {
			if Matches(pattern, dep) {
				t.Errorf("%s links %s: %s", name, dep, why)
			}
		}
	}
	for pattern := range rules {
		if missing := Missing(pattern); missing != "" {
			t.Errorf("banned %s: no such package: %s", pattern, missing)
		}
	}
}

// Matches reports whether pkg is pattern, or lies in its tree when pattern
// ends in "/...".
func Matches(pattern, pkg string) bool {
	if tree, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == tree || strings.HasPrefix(pkg, tree+"/")
	}
	return pkg == pattern
}

// Missing returns why pattern names no existing package ("" when it names
// at least one).
func Missing(pattern string) string {
	out, err := exec.Command("go", "list", "-e", "-f", "{{if .Error}}missing: {{.Error}}{{else}}{{.ImportPath}}{{end}}", pattern).CombinedOutput()
	text := strings.TrimSpace(string(out))
	switch {
	case err != nil:
		return err.Error() + ": " + text
	case text == "", strings.Contains(text, "missing: "), strings.Contains(text, "matched no packages"):
		return text
	}
	return ""
}
