// Command schemaprovider is a terraform provider that knows nothing but
// its schema: it serves the recorded `terraform providers schema -json` of
// a real provider (hashicorp/google, google-beta or time, beside the
// terraform tests in terraform/testdata), validates a configuration as far
// as the schema says (terraform core checks the rest against the schema;
// the provider refuses attributes only it sets: validate.go), and answers
// every other call with nothing to do. It exists for `terraform validate` and `terraform test`
// with `mock_provider`, which take a provider's schema from the provider
// itself, on machines that cannot download providers: terraform/ installs
// it from a filesystem mirror made at test time (TestTerraformRunsOffline).
// It is never deployed, and manages nothing: planning or applying a real
// resource with it fails, saying so.
//
// Which provider it is comes from its own file name, as terraform installs
// it (terraform-provider-google_v7.46.0), and its schema from
// $SCHEMA_PROVIDER_DIR/<name>-provider-schema.json.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/terraform-plugin-go/tfprotov5"
	"github.com/hashicorp/terraform-plugin-go/tfprotov5/tf5server"
)

// EnvSchemaDir names the directory of the recorded schemas.
const EnvSchemaDir = "SCHEMA_PROVIDER_DIR"

func main() {
	name := providerName(os.Args[0])
	schema, err := load(filepath.Join(os.Getenv(EnvSchemaDir), name+"-provider-schema.json"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "schemaprovider:", err)
		os.Exit(1)
	}
	p := &provider{schema: schema}
	if err := tf5server.Serve("registry.terraform.io/hashicorp/"+name, func() tfprotov5.ProviderServer { return p }); err != nil {
		fmt.Fprintln(os.Stderr, "schemaprovider:", err)
		os.Exit(1)
	}
}

// providerName is the provider's type from its executable's name:
// terraform-provider-<name>_v<version>.
func providerName(path string) string {
	base := strings.TrimPrefix(filepath.Base(path), "terraform-provider-")
	name, _, _ := strings.Cut(base, "_")
	return name
}

// load reads and converts a recorded schema.
func load(path string) (*tfprotov5.GetProviderSchemaResponse, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the recorded schema: %w", err)
	}
	var rec recorded
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rec.convert()
}

// provider serves the schema and manages nothing.
type provider struct {
	// The calls terraform makes of a provider that only validates and is
	// mocked are implemented below; any other call reaches this nil
	// interface and fails.
	tfprotov5.ProviderServer
	schema *tfprotov5.GetProviderSchemaResponse
}

// errNothing answers a call to manage something.
var errNothing = errors.New("schemaprovider: serves a recorded schema only and manages nothing (use it with mock_provider)")

func (p *provider) GetMetadata(context.Context, *tfprotov5.GetMetadataRequest) (*tfprotov5.GetMetadataResponse, error) {
	resp := &tfprotov5.GetMetadataResponse{ServerCapabilities: &tfprotov5.ServerCapabilities{}}
	for name := range p.schema.ResourceSchemas {
		resp.Resources = append(resp.Resources, tfprotov5.ResourceMetadata{TypeName: name})
	}
	for name := range p.schema.DataSourceSchemas {
		resp.DataSources = append(resp.DataSources, tfprotov5.DataSourceMetadata{TypeName: name})
	}
	return resp, nil
}

func (p *provider) GetProviderSchema(context.Context, *tfprotov5.GetProviderSchemaRequest) (*tfprotov5.GetProviderSchemaResponse, error) {
	return p.schema, nil
}

func (p *provider) GetResourceIdentitySchemas(context.Context, *tfprotov5.GetResourceIdentitySchemasRequest) (*tfprotov5.GetResourceIdentitySchemasResponse, error) {
	return &tfprotov5.GetResourceIdentitySchemasResponse{}, nil
}

func (p *provider) PrepareProviderConfig(_ context.Context, req *tfprotov5.PrepareProviderConfigRequest) (*tfprotov5.PrepareProviderConfigResponse, error) {
	return &tfprotov5.PrepareProviderConfigResponse{PreparedConfig: req.Config}, nil
}

func (p *provider) ConfigureProvider(context.Context, *tfprotov5.ConfigureProviderRequest) (*tfprotov5.ConfigureProviderResponse, error) {
	return &tfprotov5.ConfigureProviderResponse{}, nil
}

func (p *provider) StopProvider(context.Context, *tfprotov5.StopProviderRequest) (*tfprotov5.StopProviderResponse, error) {
	return &tfprotov5.StopProviderResponse{}, nil
}

func (p *provider) ValidateResourceTypeConfig(_ context.Context, req *tfprotov5.ValidateResourceTypeConfigRequest) (*tfprotov5.ValidateResourceTypeConfigResponse, error) {
	s := p.schema.ResourceSchemas[req.TypeName]
	if s == nil {
		return nil, fmt.Errorf("schemaprovider: no resource %s in the recorded schema", req.TypeName)
	}
	return &tfprotov5.ValidateResourceTypeConfigResponse{Diagnostics: unconfigurable(s.Block, req.Config)}, nil
}

func (p *provider) ValidateDataSourceConfig(_ context.Context, req *tfprotov5.ValidateDataSourceConfigRequest) (*tfprotov5.ValidateDataSourceConfigResponse, error) {
	s := p.schema.DataSourceSchemas[req.TypeName]
	if s == nil {
		return nil, fmt.Errorf("schemaprovider: no data source %s in the recorded schema", req.TypeName)
	}
	return &tfprotov5.ValidateDataSourceConfigResponse{Diagnostics: unconfigurable(s.Block, req.Config)}, nil
}

func (p *provider) GetFunctions(context.Context, *tfprotov5.GetFunctionsRequest) (*tfprotov5.GetFunctionsResponse, error) {
	return &tfprotov5.GetFunctionsResponse{}, nil
}

func (p *provider) PlanResourceChange(context.Context, *tfprotov5.PlanResourceChangeRequest) (*tfprotov5.PlanResourceChangeResponse, error) {
	return nil, errNothing
}

func (p *provider) ApplyResourceChange(context.Context, *tfprotov5.ApplyResourceChangeRequest) (*tfprotov5.ApplyResourceChangeResponse, error) {
	return nil, errNothing
}

func (p *provider) ReadResource(context.Context, *tfprotov5.ReadResourceRequest) (*tfprotov5.ReadResourceResponse, error) {
	return nil, errNothing
}

func (p *provider) ReadDataSource(context.Context, *tfprotov5.ReadDataSourceRequest) (*tfprotov5.ReadDataSourceResponse, error) {
	return nil, errNothing
}
