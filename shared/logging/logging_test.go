package logging_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/logging"
)

func TestCloudLoggingShape(t *testing.T) {
	t.Parallel()
	cases := []struct {
		level slog.Level
		want  string
	}{{slog.LevelInfo, "INFO"}, {slog.LevelWarn, "WARNING"}, {slog.LevelError, "ERROR"}}
	for _, c := range cases {
		var buf bytes.Buffer
		logging.New(&buf, slog.LevelDebug).Log(t.Context(), c.level, "drained", slog.String("workspace", "w1"))
		var line map[string]any
		require.NoError(t, json.Unmarshal(buf.Bytes(), &line))
		require.Equal(t, c.want, line["severity"])
		require.Equal(t, "drained", line["message"])
		require.Equal(t, "w1", line["workspace"])
	}
}

// TestAttributesNamedLikeTheRecordsOwn: an attribute the caller keys
// "level" (any type) is written as it is, never taken for the record's
// level (a type assertion on it once panicked the process).
func TestAttributesNamedLikeTheRecordsOwn(t *testing.T) {
	t.Parallel()
	for _, v := range []any{"high", 3, slog.LevelWarn, nil} {
		var buf bytes.Buffer
		require.NotPanics(t, func() { logging.New(&buf, slog.LevelDebug).Info("x", "level", v) })
		var line map[string]any
		require.NoError(t, json.Unmarshal(buf.Bytes(), &line), buf.String())
		require.Equal(t, "INFO", line["severity"])
		require.Contains(t, line, "attr_level")
	}
	var buf bytes.Buffer
	logging.New(&buf, slog.LevelDebug).With("message", "m", "time", 1).Info("x")
	var line map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &line))
	require.Equal(t, "x", line["message"])
	require.Equal(t, "m", line["attr_message"])
}

func TestParseLevel(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want slog.Level
		ok   bool
	}{{"", slog.LevelInfo, true}, {"debug", slog.LevelDebug, true}, {"WARNING", slog.LevelWarn, true}, {"ERROR", slog.LevelError, true}, {"loud", 0, false}} {
		t.Run(c.in, func(t *testing.T) {
			got, err := logging.ParseLevel(c.in)
			if !c.ok {
				require.ErrorContains(t, err, "not a log level")
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
}
