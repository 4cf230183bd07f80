package main

import (
	"encoding/json"
	"fmt"
	"sort"

	"github.com/hashicorp/terraform-plugin-go/tfprotov5"
	"github.com/hashicorp/terraform-plugin-go/tftypes"
)

// recorded is one provider's entry of `terraform providers schema -json`,
// with its address and version beside it (terraform/testdata/README.md).
type recorded struct {
	Provider          string                    `json:"provider"`
	ProviderVersion   string                    `json:"provider_version"`
	ProviderSchema    recordedSchema            `json:"provider_schema"`
	ResourceSchemas   map[string]recordedSchema `json:"resource_schemas"`
	DataSourceSchemas map[string]recordedSchema `json:"data_source_schemas"`
}

type recordedSchema struct {
	Version int64         `json:"version"`
	Block   recordedBlock `json:"block"`
}

type recordedBlock struct {
	Attributes      map[string]recordedAttribute `json:"attributes"`
	BlockTypes      map[string]recordedBlockType `json:"block_types"`
	Description     string                       `json:"description"`
	DescriptionKind string                       `json:"description_kind"`
	Deprecated      bool                         `json:"deprecated"`
}

type recordedAttribute struct {
	Type            json.RawMessage `json:"type"`
	Description     string          `json:"description"`
	DescriptionKind string          `json:"description_kind"`
	Required        bool            `json:"required"`
	Optional        bool            `json:"optional"`
	Computed        bool            `json:"computed"`
	Sensitive       bool            `json:"sensitive"`
	Deprecated      bool            `json:"deprecated"`
	WriteOnly       bool            `json:"write_only"`
}

type recordedBlockType struct {
	NestingMode string        `json:"nesting_mode"`
	Block       recordedBlock `json:"block"`
	MinItems    int64         `json:"min_items"`
	MaxItems    int64         `json:"max_items"`
}

// convert turns the recording into the plugin protocol's schema.
func (r recorded) convert() (*tfprotov5.GetProviderSchemaResponse, error) {
	provider, err := r.ProviderSchema.convert()
	if err != nil {
		return nil, fmt.Errorf("provider: %w", err)
	}
	resp := &tfprotov5.GetProviderSchemaResponse{Provider: provider, ResourceSchemas: map[string]*tfprotov5.Schema{},
		DataSourceSchemas: map[string]*tfprotov5.Schema{}, ServerCapabilities: &tfprotov5.ServerCapabilities{}}
	for name, s := range r.ResourceSchemas {
		if resp.ResourceSchemas[name], err = s.convert(); err != nil {
			return nil, fmt.Errorf("resource %s: %w", name, err)
		}
	}
	for name, s := range r.DataSourceSchemas {
		if resp.DataSourceSchemas[name], err = s.convert(); err != nil {
			return nil, fmt.Errorf("data source %s: %w", name, err)
		}
	}
	return resp, nil
}

func (s recordedSchema) convert() (*tfprotov5.Schema, error) {
	b, err := s.Block.convert()
	return &tfprotov5.Schema{Version: s.Version, Block: b}, err
}

func (b recordedBlock) convert() (*tfprotov5.SchemaBlock, error) {
	out := &tfprotov5.SchemaBlock{Description: b.Description, Deprecated: b.Deprecated, DescriptionKind: kind(b.DescriptionKind)}
	for _, name := range sortedKeys(b.Attributes) {
		a := b.Attributes[name]
		t, err := ctyType(a.Type)
		if err != nil {
			return nil, fmt.Errorf("attribute %s: %w", name, err)
		}
		out.Attributes = append(out.Attributes, &tfprotov5.SchemaAttribute{Name: name, Type: t, Description: a.Description,
			DescriptionKind: kind(a.DescriptionKind), Required: a.Required, Optional: a.Optional, Computed: a.Computed,
			Sensitive: a.Sensitive, Deprecated: a.Deprecated, WriteOnly: a.WriteOnly})
	}
	for _, name := range sortedKeys(b.BlockTypes) {
		bt := b.BlockTypes[name]
		inner, err := bt.Block.convert()
		if err != nil {
			return nil, fmt.Errorf("block %s: %w", name, err)
		}
		nesting, ok := map[string]tfprotov5.SchemaNestedBlockNestingMode{"single": tfprotov5.SchemaNestedBlockNestingModeSingle,
			"list": tfprotov5.SchemaNestedBlockNestingModeList, "set": tfprotov5.SchemaNestedBlockNestingModeSet,
			"map": tfprotov5.SchemaNestedBlockNestingModeMap, "group": tfprotov5.SchemaNestedBlockNestingModeGroup}[bt.NestingMode]
		if !ok {
			return nil, fmt.Errorf("block %s: nesting mode %q", name, bt.NestingMode)
		}
		out.BlockTypes = append(out.BlockTypes, &tfprotov5.SchemaNestedBlock{TypeName: name, Block: inner, Nesting: nesting,
			MinItems: bt.MinItems, MaxItems: bt.MaxItems})
	}
	return out, nil
}

func kind(k string) tfprotov5.StringKind {
	if k == "markdown" {
		return tfprotov5.StringKindMarkdown
	}
	return tfprotov5.StringKindPlain
}

// ctyType converts a type in cty's JSON form ("string", ["list","string"],
// ["object",{…},["optional"…]], …) to the protocol's.
func ctyType(raw json.RawMessage) (tftypes.Type, error) {
	var prim string
	if json.Unmarshal(raw, &prim) == nil {
		t, ok := map[string]tftypes.Type{"string": tftypes.String, "number": tftypes.Number, "bool": tftypes.Bool,
			"dynamic": tftypes.DynamicPseudoType}[prim]
		if !ok {
			return nil, fmt.Errorf("type %q", prim)
		}
		return t, nil
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil || len(parts) < 2 {
		return nil, fmt.Errorf("type %s", raw)
	}
	var k string
	if err := json.Unmarshal(parts[0], &k); err != nil {
		return nil, fmt.Errorf("type %s", raw)
	}
	switch k {
	case "list", "set", "map":
		elem, err := ctyType(parts[1])
		if err != nil {
			return nil, err
		}
		return map[string]tftypes.Type{"list": tftypes.List{ElementType: elem}, "set": tftypes.Set{ElementType: elem},
			"map": tftypes.Map{ElementType: elem}}[k], nil
	case "object":
		var attrs map[string]json.RawMessage
		if err := json.Unmarshal(parts[1], &attrs); err != nil {
			return nil, fmt.Errorf("type %s", raw)
		}
		obj := tftypes.Object{AttributeTypes: map[string]tftypes.Type{}}
		for name, at := range attrs {
			t, err := ctyType(at)
			if err != nil {
				return nil, err
			}
			obj.AttributeTypes[name] = t
		}
		if len(parts) > 2 {
			var optional []string
			if err := json.Unmarshal(parts[2], &optional); err != nil {
				return nil, fmt.Errorf("type %s", raw)
			}
			obj.OptionalAttributes = map[string]struct{}{}
			for _, name := range optional {
				obj.OptionalAttributes[name] = struct{}{}
			}
		}
		return obj, nil
	case "tuple":
		var elems []json.RawMessage
		if err := json.Unmarshal(parts[1], &elems); err != nil {
			return nil, fmt.Errorf("type %s", raw)
		}
		tuple := tftypes.Tuple{}
		for _, e := range elems {
			t, err := ctyType(e)
			if err != nil {
				return nil, err
			}
			tuple.ElementTypes = append(tuple.ElementTypes, t)
		}
		return tuple, nil
	}
	return nil, fmt.Errorf("type %s", raw)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
