package main

import "github.com/segmentstream/ontology-replication/shared/testbench/sandbox"

func main() { sandbox.Main(runChaosCommand) }
