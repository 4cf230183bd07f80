package main

import (
	"testing"

	"github.com/segmentstream/ontology-replication/shared/testbench/deptest"
)

// TestLinksNoBench: the job links none of the test bench (deptest.Check).
func TestLinksNoBench(t *testing.T) {
	t.Parallel()
	deptest.Check(t, "./job", ".")
}
