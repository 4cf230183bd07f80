package main

import (
	"encoding/json"
	"io"
	"os"
	"strings"

	"golang.org/x/term"
)

// How the job writes its answers: JSON documents and one-line messages,
// for a terminal or not.

// writeJSON writes one JSON document: indented on a terminal, compact
// otherwise.
func (e *env) writeJSON(v any) error {
	enc := json.NewEncoder(e.stdout)
	if isTerminal(e.stdout) {
		enc.SetIndent("", "  ")
	}
	return enc.Encode(v)
}

// isTerminal reports whether w is a terminal (not a pipe, a file or
// /dev/null).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// oneLine flattens a multi-line message (pgx's errors carry details on
// later lines) into one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}
