// Package cliflags spells a Go flag set as the commands' help does, GNU
// style: --name, in the help and in a parse error. (The flag package takes
// -name and --name alike, and prints -name.)
package cliflags

import (
	"flag"
	"fmt"
	"regexp"
	"strings"
)

// Usage lists fs's flags, one a line: "  --name  usage (default …)", names
// padded to one column; a flag's zero default is not shown.
func Usage(fs *flag.FlagSet) string {
	var b strings.Builder
	width := 0
	fs.VisitAll(func(f *flag.Flag) { width = max(width, len(f.Name)) })
	fs.VisitAll(func(f *flag.Flag) {
		fmt.Fprintf(&b, "  --%-*s  %s", width, f.Name, f.Usage)
		if d := f.DefValue; d != "" && d != "0" && d != "false" && d != "0s" && !strings.Contains(f.Usage, "default") {
			fmt.Fprintf(&b, " (default %s)", d)
		}
		b.WriteByte('\n')
	})
	return strings.TrimRight(b.String(), "\n")
}

// flagNames are the flag package's single-dash flag names in its errors
// ("flag provided but not defined: -bogus").
var flagNames = regexp.MustCompile(`(^|[ :])-([a-z][a-z-]*)`)

// Dashes spells the flags of a flag error as the help does: --bogus.
func Dashes(msg string) string { return flagNames.ReplaceAllString(msg, "$1--$2") }
