// Package terraform_test holds the deployment's specifications, beside the
// HCL they check: offline checks of terraform/ and cloudbuild.yaml against
// the google provider's schema (testdata), the code's environment
// variables, table schema and log lines, least privilege, and the
// monitoring's filters and thresholds. terraform/tests has the plans,
// which need the provider installed.
package terraform_test

import (
	"testing"

	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
