package main

import (
	"fmt"

	"github.com/hashicorp/terraform-plugin-go/tfprotov5"
	"github.com/hashicorp/terraform-plugin-go/tftypes"
)

// unconfigurable checks what terraform core leaves to the provider: an
// attribute the provider alone sets (computed, neither required nor
// optional) must not be written in the configuration, at the top or in a
// nested block. The real providers refuse it in their own validation
// (the plugin SDK's "Value for unconfigurable attribute"); without this a
// configuration that sets one would pass offline and fail against them.
func unconfigurable(block *tfprotov5.SchemaBlock, config *tfprotov5.DynamicValue) []*tfprotov5.Diagnostic {
	if block == nil || config == nil {
		return nil
	}
	val, err := config.Unmarshal(block.ValueType())
	if err != nil {
		return []*tfprotov5.Diagnostic{{Severity: tfprotov5.DiagnosticSeverityError, Summary: "Invalid configuration",
			Detail: fmt.Sprintf("schemaprovider: decode the configuration: %v", err)}}
	}
	return checkBlock(block, val, tftypes.NewAttributePath())
}

// checkBlock is unconfigurable for one block's value at path.
func checkBlock(block *tfprotov5.SchemaBlock, val tftypes.Value, path *tftypes.AttributePath) []*tfprotov5.Diagnostic {
	if val.IsNull() || !val.IsKnown() {
		return nil
	}
	var fields map[string]tftypes.Value
	if err := val.As(&fields); err != nil {
		return nil
	}
	var diags []*tfprotov5.Diagnostic
	for _, a := range block.Attributes {
		v, ok := fields[a.Name]
		if ok && a.Computed && !a.Optional && !a.Required && !v.IsNull() {
			diags = append(diags, &tfprotov5.Diagnostic{Severity: tfprotov5.DiagnosticSeverityError,
				Summary:   "Value for unconfigurable attribute",
				Detail:    fmt.Sprintf("Can't configure a value for %q: its value will be decided automatically based on the result of applying this configuration.", a.Name),
				Attribute: path.WithAttributeName(a.Name)})
		}
	}
	for _, nb := range block.BlockTypes {
		v, ok := fields[nb.TypeName]
		if !ok || v.IsNull() || !v.IsKnown() {
			continue
		}
		at := path.WithAttributeName(nb.TypeName)
		switch nb.Nesting {
		case tfprotov5.SchemaNestedBlockNestingModeSingle, tfprotov5.SchemaNestedBlockNestingModeGroup:
			diags = append(diags, checkBlock(nb.Block, v, at)...)
		case tfprotov5.SchemaNestedBlockNestingModeMap:
			var items map[string]tftypes.Value
			if v.As(&items) == nil {
				for k, item := range items {
					diags = append(diags, checkBlock(nb.Block, item, at.WithElementKeyString(k))...)
				}
			}
		default: // list, set
			var items []tftypes.Value
			if v.As(&items) == nil {
				for i, item := range items {
					diags = append(diags, checkBlock(nb.Block, item, at.WithElementKeyInt(i))...)
				}
			}
		}
	}
	return diags
}
