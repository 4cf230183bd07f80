// Command cmd serves the replication functions with the functions
// framework's own server: the container image's entry point on Cloud Run and
// the local runner for manual tests.
//
//	REPLICATION_WORKSPACES_FILE=registry.json go run ./functions/cmd -port 8080
//
// With FUNCTION_TARGET=Drain (or Verify) it serves that one function at / and
// every path below it, as each Cloud Run service runs. Without it, it serves
// both: the drain at /api/internal/v1/workspaces/{workspace}/ontology/replication/drain
// (and /Drain), the verifier at /Verify.
package main

import (
	"cmp"
	"flag"
	"fmt"
	"os"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"

	"github.com/segmentstream/ontology-replication/functions"
)

func main() {
	port := flag.String("port", cmp.Or(os.Getenv("PORT"), "8080"), "port to listen on (default $PORT or 8080)")
	flag.Parse()
	if err := functions.Check(os.Getenv("FUNCTION_TARGET")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := funcframework.Start(*port); err != nil {
		fmt.Fprintln(os.Stderr, "functions:", err)
		os.Exit(1)
	}
}
