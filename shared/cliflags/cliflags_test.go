package cliflags_test

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/cliflags"
)

// TestGNUSpelling: the help and a parse error spell flags --name.
func TestGNUSpelling(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Bool("json", false, "one JSON document")
	fs.Duration("chaos", 0, "run under faults")
	fs.Int("drains", 2, "drain instances")
	fs.String("plot", "", "an SVG file (default: none)")
	fs.Duration("timeout", 3*time.Minute, "how long to wait")
	require.Equal(t, "  --chaos    run under faults\n  --drains   drain instances (default 2)\n  --json     one JSON document\n"+
		"  --plot     an SVG file (default: none)\n  --timeout  how long to wait (default 3m0s)", cliflags.Usage(fs))
	err := fs.Parse([]string{"--bogus"})
	require.Error(t, err)
	cases := []struct{ in, want string }{
		{err.Error(), "flag provided but not defined: --bogus"},
		{"invalid value \"x\" for flag -drains: parse error", "invalid value \"x\" for flag --drains: parse error"},
		{"a-b -c", "a-b --c"},
	}
	for _, c := range cases {
		require.Equal(t, c.want, cliflags.Dashes(c.in))
	}
}
