package deptest_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCIChecksHoldWithoutGit: in a tree with no .git (what Cloud Build's
// upload is), .ci/tracked-files still refuses a file over 1 MB and a
// compiled executable, and .ci/gofmt-check still refuses an unformatted Go
// file: they list the tree's files themselves (.ci/tree-files) instead of
// passing on an empty list.
func TestCIChecksHoldWithoutGit(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, ".ci"), 0o755))
	for _, script := range []string{"tree-files", "tracked-files", "gofmt-check"} {
		raw, err := os.ReadFile(filepath.Join("..", "..", "..", ".ci", script))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(root, ".ci", script), raw, 0o755))
	}
	write := func(name string, content []byte) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, name), content, 0o644))
	}
	write("pkg/ok.go", []byte("package pkg\n\nfunc F() {}\n"))
	run := func(script string) (string, error) {
		cmd := exec.Command("bash", filepath.Join(root, ".ci", script))
		cmd.Dir = root
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	out, err := run("tracked-files")
	require.NoError(t, err, "a clean tree passes: %s", out)
	require.Contains(t, out, "no .git here")
	out, err = run("gofmt-check")
	require.NoError(t, err, "%s", out)

	write("big.bin", bytes.Repeat([]byte("x"), 2<<20))
	elf, err := os.Executable() // this test's own binary: an ELF file
	require.NoError(t, err)
	raw, err := os.ReadFile(elf)
	require.NoError(t, err)
	write("tools/planted", raw[:4096])
	write("pkg/bad.go", []byte("package pkg\n\nfunc  G( ) {}\n"))
	out, err = run("tracked-files")
	require.Error(t, err)
	require.Contains(t, out, "tracked file over 1 MB outside testdata/: big.bin")
	require.Contains(t, out, "tracked file is a compiled executable: tools/planted")
	out, err = run("gofmt-check")
	require.Error(t, err)
	require.Contains(t, out, "pkg/bad.go")
}

// TestCIDocLengthsRefuseEachExcess: .ci/doc-lengths passes docs at each of
// its bounds and refuses one line or character past any of them.
func TestCIDocLengthsRefuseEachExcess(t *testing.T) {
	t.Parallel()
	script, err := filepath.Abs(filepath.Join("..", "..", "..", ".ci", "doc-lengths"))
	require.NoError(t, err)
	lines := func(n int, line string) string { return strings.Repeat(line+"\n", n) }
	prose, code := strings.Repeat("p", 120), strings.Repeat("c", 160)
	codeBlock := "```sh\n" + code + "\n```\n"
	cases := []struct {
		name, readme, performance string
		refused                   string // "" passes
	}{
		{"at every bound", lines(449-3, prose) + codeBlock, lines(3, strings.Repeat("r", 400)), ""},
		{"450 README lines", lines(450, "x"), "", "README.md has 450 lines"},
		{"a prose line of 121", prose + "p\n", "", "README.md:1: 121 characters"},
		{"a code line of 161", "```\n" + code + "c\n```\n", "", "README.md:2: 161 characters"},
		{"a PERFORMANCE.md line of 401", "", strings.Repeat("r", 401) + "\n", "PERFORMANCE.md:1: 401 characters"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(root, "README.md"), []byte(c.readme), 0o644))
			require.NoError(t, os.WriteFile(filepath.Join(root, "PERFORMANCE.md"), []byte(c.performance), 0o644))
			cmd := exec.Command("bash", script)
			cmd.Dir = root
			out, err := cmd.CombinedOutput()
			if c.refused == "" {
				require.NoError(t, err, "%s", out)
				return
			}
			require.Error(t, err)
			require.Contains(t, string(out), c.refused)
		})
	}
}
