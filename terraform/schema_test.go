package terraform_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/stretchr/testify/require"
)

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
