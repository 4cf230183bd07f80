// Package terraform carries the deployment's README into the test bench:
// its Database access section is the GRANT statements an operator gives
// each component, which the local mode's and the tests' component roles are
// made of (sdkfixture.ComponentRoles), so that they connect exactly as the
// README says the deployed components do. No deployed binary imports it
// (shared/testbench/deptest).
package terraform

import _ "embed"

// README is terraform/README.md.
//
//go:embed README.md
var README []byte
