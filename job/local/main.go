package main

import "github.com/segmentstream/ontology-replication/shared/testbench/sandbox"

func main() { sandbox.Main(runLocal) }

// yes says a yes-or-no figure of the summary.
func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
