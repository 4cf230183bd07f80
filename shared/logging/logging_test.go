package logging_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

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
		logging.New(&buf, logging.Config{Level: slog.LevelDebug}).Log(t.Context(), c.level, "drained", slog.String("workspace", "w1"))
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
		require.NotPanics(t, func() { logging.New(&buf, logging.Config{Level: slog.LevelDebug}).Info("x", "level", v) })
		var line map[string]any
		require.NoError(t, json.Unmarshal(buf.Bytes(), &line), buf.String())
		require.Equal(t, "INFO", line["severity"])
		require.Contains(t, line, "attr_level")
	}
	var buf bytes.Buffer
	logging.New(&buf, logging.Config{Level: slog.LevelDebug}).With("message", "m", "time", 1).Info("x")
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

func TestTraceFromRequest(t *testing.T) {
	t.Parallel()
	const id = "4bf92f3577b34da6a3ce929d0e0e4736"
	for _, c := range []struct {
		name, traceparent, cloud string
		want                     logging.Trace
		ok                       bool
	}{
		{"traceparent sampled", "00-" + id + "-00f067aa0ba902b7-01", "", logging.Trace{TraceID: id, SpanID: "00f067aa0ba902b7", Sampled: true}, true},
		{"traceparent not sampled", "00-" + id + "-00f067aa0ba902b7-00", "", logging.Trace{TraceID: id, SpanID: "00f067aa0ba902b7"}, true},
		{"traceparent first", "00-" + id + "-00f067aa0ba902b7-01", "105445aa7843bc8bf206b12000100000/1;o=1", logging.Trace{TraceID: id, SpanID: "00f067aa0ba902b7", Sampled: true}, true},
		{"cloud trace context", "", "105445AA7843BC8BF206B12000100000/12345;o=1", logging.Trace{TraceID: "105445aa7843bc8bf206b12000100000", SpanID: "0000000000003039", Sampled: true}, true},
		{"cloud trace without span", "", "105445aa7843bc8bf206b12000100000", logging.Trace{TraceID: "105445aa7843bc8bf206b12000100000"}, true},
		{"cloud trace not sampled", "", "105445aa7843bc8bf206b12000100000/1;o=0", logging.Trace{TraceID: "105445aa7843bc8bf206b12000100000", SpanID: "0000000000000001"}, true},
		{"malformed traceparent falls back", "00-xyz-00f067aa0ba902b7-01", "105445aa7843bc8bf206b12000100000/1", logging.Trace{TraceID: "105445aa7843bc8bf206b12000100000", SpanID: "0000000000000001"}, true},
		{"all-zero trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "", logging.Trace{}, false},
		{"all-zero span id", "00-" + id + "-0000000000000000-01", "", logging.Trace{}, false},
		{"version ff", "ff-" + id + "-00f067aa0ba902b7-01", "", logging.Trace{}, false},
		{"upper-case traceparent", "00-" + "4BF92F3577B34DA6A3CE929D0E0E4736" + "-00f067aa0ba902b7-01", "", logging.Trace{}, false},
		{"short cloud trace", "", "105445aa/1;o=1", logging.Trace{}, false},
		{"none", "", "", logging.Trace{}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			if c.traceparent != "" {
				r.Header.Set("traceparent", c.traceparent)
			}
			if c.cloud != "" {
				r.Header.Set("X-Cloud-Trace-Context", c.cloud)
			}
			got, ok := logging.TraceFromRequest(r)
			require.Equal(t, c.ok, ok)
			require.Equal(t, c.want, got)
		})
	}
}

// TestCloudLoggingFields: a line logged with a request's trace carries it
// as Cloud Logging links it; a workspace attribute is also the entry's
// label; an ERROR line is in Error Reporting's shape; an INFO line is not.
func TestCloudLoggingFields(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := logging.New(&buf, logging.Config{Level: slog.LevelInfo, ProjectID: "acme", Service: "replication-drain"})
	ctx := logging.WithTrace(t.Context(), logging.Trace{TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7", Sampled: true})
	log.ErrorContext(ctx, "replication drain", slog.String("workspace", "w1"), slog.String("error", "boom"))
	log.With("workspace", "w2").InfoContext(t.Context(), "replication verify workspace", slog.Int("verified", 3))
	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	require.Len(t, lines, 2)
	var errLine, infoLine map[string]any
	require.NoError(t, json.Unmarshal(lines[0], &errLine))
	require.NoError(t, json.Unmarshal(lines[1], &infoLine))
	require.Equal(t, "projects/acme/traces/4bf92f3577b34da6a3ce929d0e0e4736", errLine["logging.googleapis.com/trace"])
	require.Equal(t, "00f067aa0ba902b7", errLine["logging.googleapis.com/spanId"])
	require.Equal(t, true, errLine["logging.googleapis.com/trace_sampled"])
	require.Equal(t, map[string]any{"workspace": "w1"}, errLine["logging.googleapis.com/labels"])
	require.Equal(t, "type.googleapis.com/google.devtools.clouderrorreporting.v1beta1.ReportedErrorEvent", errLine["@type"])
	require.Equal(t, map[string]any{"service": "replication-drain"}, errLine["serviceContext"])
	require.Equal(t, "boom", errLine["error"])

	require.NotContains(t, infoLine, "logging.googleapis.com/trace", "no trace in the context: none on the line")
	require.NotContains(t, infoLine, "@type", "only errors are reported")
	require.Equal(t, map[string]any{"workspace": "w2"}, infoLine["logging.googleapis.com/labels"], "a workspace given to With labels the line too")

	buf.Reset()
	logging.New(&buf, logging.Config{Level: slog.LevelInfo}).InfoContext(ctx, "x")
	require.NotContains(t, buf.String(), "logging.googleapis.com/trace", "without a project, no trace: Cloud Logging needs its full name")
}

// TestLinesAreBounded: a huge string value, a huge error and a huge
// workspace label are cut to the bounds, and a line that is still too long
// (many long values) is replaced by a short one that keeps its severity and
// message: no input makes a line longer than MaxLineBytes.
func TestLinesAreBounded(t *testing.T) {
	t.Parallel()
	huge := strings.Repeat("k", 500<<10)
	cases := []struct {
		name string
		args []any
	}{
		{"a string", []any{"kid", huge}},
		{"an error", []any{"error", errors.New("unknown key id " + huge)}},
		{"a workspace", []any{"workspace", huge}},
		{"many values", func() []any {
			var args []any
			for i := range 100 {
				args = append(args, fmt.Sprintf("field_%d", i), huge)
			}
			return args
		}()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			logging.New(&buf, logging.Config{Level: slog.LevelDebug}).Warn("replication drain", c.args...)
			require.LessOrEqual(t, buf.Len(), logging.MaxLineBytes)
			require.Equal(t, 1, strings.Count(buf.String(), "\n"), "one line")
			var line map[string]any
			require.NoError(t, json.Unmarshal(buf.Bytes(), &line), buf.String())
			require.Equal(t, "WARNING", line["severity"])
			require.Equal(t, "replication drain", line["message"])
			for k, v := range line {
				if s, ok := v.(string); ok {
					require.LessOrEqual(t, len(s), logging.MaxValueBytes, k)
				}
			}
		})
	}
	// An error is written as its text (cut when huge), not as the value's
	// fields (which an error rarely exports: "{}").
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("drain: %w", errors.New("pubsub unavailable")), `^drain: pubsub unavailable$`},
		{errors.New("unknown key id " + huge), `^unknown key id k+…\[\d+ bytes left out\]$`},
	} {
		var buf bytes.Buffer
		logging.New(&buf, logging.Config{Level: slog.LevelDebug}).Error("replication drain", "error", c.err)
		var line map[string]any
		require.NoError(t, json.Unmarshal(buf.Bytes(), &line), buf.String())
		text, ok := line["error"].(string)
		require.True(t, ok, "the error is a string field: %v", line["error"])
		require.Regexp(t, c.want, text)
	}

	var buf bytes.Buffer
	logging.New(&buf, logging.Config{Level: slog.LevelDebug}).Info("x", "path", logging.Untrusted("/a\nb"+huge))
	require.Contains(t, buf.String(), `\"/a\\nb`, "quoted: the newline shows")
	require.Less(t, buf.Len(), 400)
}

// FuzzTruncate: Truncate keeps what fits, and cuts the rest to at most the
// bound (or the marker's own length for tiny bounds) at a character
// boundary, so valid UTF-8 stays valid.
func FuzzTruncate(f *testing.F) {
	f.Add("hello", 3)
	f.Add(strings.Repeat("é", 100), 41)
	f.Add(strings.Repeat("日本", 50), 60)
	f.Fuzz(func(t *testing.T, s string, n int) {
		n = n % 5000
		if n < 0 {
			n = -n
		}
		got := logging.Truncate(s, n)
		if len(s) <= n {
			require.Equal(t, s, got)
			return
		}
		require.LessOrEqual(t, len(got), max(n, 40))
		if utf8.ValidString(s) {
			require.True(t, utf8.ValidString(got))
		}
	})
}
