package terraform_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

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
