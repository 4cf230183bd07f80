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
