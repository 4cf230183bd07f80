// Command schemagen writes the BigQuery events table schema (event.TableSchema)
// as the JSON terraform reads with file(): `go generate ./shared/event`.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/segmentstream/ontology-replication/shared/event"
)

func main() {
	out := flag.String("out", "", "file to write")
	flag.Parse()
	raw, err := json.MarshalIndent(event.TableSchema, "", "  ")
	if err == nil {
		err = os.WriteFile(*out, append(raw, '\n'), 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "schemagen:", err)
		os.Exit(1)
	}
}
