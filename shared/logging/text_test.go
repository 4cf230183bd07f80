package logging_test

import (
	"bytes"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/logging"
)

// TestTextLinesAreForPeople: a terminal's line is the time, the severity,
// the message and key=value pairs, a value with a space quoted, groups
// dotted, long values bounded, lines under the level left out.
func TestTextLinesAreForPeople(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		log  func(l *slog.Logger)
		want string // after the time
	}{
		{"plain", func(l *slog.Logger) { l.Info("replication drain", "workspace", "w1", "published", 3) },
			"INFO replication drain workspace=w1 published=3"},
		{"quoted", func(l *slog.Logger) { l.Warn("failed", "error", errors.New("no route to host")) },
			`WARNING failed error="no route to host"`},
		{"with attrs and a group", func(l *slog.Logger) { l.With("job", "audit").WithGroup("g").Error("done", "n", 1) },
			"ERROR done job=audit g.n=1"},
		{"empty value", func(l *slog.Logger) { l.Info("m", "cause", "") }, `INFO m cause=""`},
		{"below the level", func(l *slog.Logger) { l.Debug("hidden") }, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			c.log(logging.NewText(&buf, logging.Config{Level: slog.LevelInfo}))
			if c.want == "" {
				require.Empty(t, buf.String())
				return
			}
			line := strings.TrimSuffix(buf.String(), "\n")
			require.Regexp(t, regexp.MustCompile(`^\d\d:\d\d:\d\d `), line)
			require.Equal(t, c.want, line[len("15:04:05 "):])
		})
	}
	var buf bytes.Buffer
	logging.NewText(&buf, logging.Config{}).Info("m", "big", strings.Repeat("x", 10_000))
	require.Less(t, buf.Len(), logging.MaxValueBytes+100, "a long value is bounded")
}
