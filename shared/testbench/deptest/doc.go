// Package deptest checks that the deployed binaries link none of the test
// bench: each binary's own test (job/deps_test.go, functions/cmd/deps_test.go)
// calls Check, which runs `go list -deps` on it and fails on any package of
// BadDeps, and on a banned package that no longer exists, as tailscale's
// tstest/deptest does. Its own test checks the layers' direct imports
// (NoDirectImports). It is never deployed.
package deptest

// BadDeps are the packages (or package trees, ending in "/...") the
// deployed binaries must not link, with the reason.
var BadDeps = map[string]string{
	"github.com/segmentstream/ontology-replication/shared/testbench/...": "test harnesses, fixtures, fakes and the local warehouse serve tests and the local mode only",
	"github.com/segmentstream/ontology-replication/job/local":            "the local mode is a demonstration, not the job",
	"github.com/segmentstream/ontology-replication/job/chaos":            "the chaos proof tests the product, it is not part of it",
	"cloud.google.com/go/pubsub/v2/pstest":                               "the in-process Pub/Sub emulator",
	"testing":                                                            "test code",
	"github.com/stretchr/testify/...":                                    "test assertions",
}

// Binaries are the deployed main packages, with the packages each must not
// link beyond BadDeps.
var Binaries = map[string]map[string]string{
	"./job": {
		"github.com/segmentstream/ontology-replication/functions":   "its init loads the registry and builds a second delivery service on every job run",
		"github.com/GoogleCloudPlatform/functions-framework-go/...": "the job serves no functions",
	},
	"./functions/cmd": {},
}

// Store is the package of every SQL statement against the ontology
// database.
const Store = "github.com/segmentstream/ontology-replication/shared/store"

// Warehouse is the package of the BigQuery lookups and views.
const Warehouse = "github.com/segmentstream/ontology-replication/shared/warehouse"

// NoDirectImports are packages that must not import some others directly,
// with the reason: delivery is the shells' one way into the store, and the
// warehouse (BigQuery) sits beside the store, not above it.
var NoDirectImports = map[string]map[string]string{
	"./job":                      {Store: "the job speaks to the store only through delivery"},
	"./job/local":                {Store: "the local mode drives the product as an operator would: through delivery"},
	"./job/chaos":                {Store: "the chaos proof drives the product as an operator would: through delivery"},
	"./shared/testbench/sandbox": {Store: "the sandbox drives the product as an operator would: through delivery"},
	"./functions":                {Store: "the functions speak to the store only through delivery", Warehouse: "the functions reach BigQuery only through delivery"},
	"./functions/cmd":            {Store: "the functions' entry point speaks to the store only through delivery"},
	"./shared/warehouse":         {Store: "the warehouse takes its own input type"},
	"./shared/delivery":          {"github.com/segmentstream/ontology-replication/shared/identity": "tokens are the shells' business: a caller maps its own errors to a cause"},
}
