// Package logging builds the project's structured logger: JSON lines on
// stdout in Cloud Logging's shape (severity, message, time), so Cloud Run
// and Cloud Functions parse each line into a structured entry.
package logging

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Config configures a logger.
type Config struct {
	// Level is the least level written.
	Level slog.Level
	// ProjectID is the Google Cloud project the process runs in
	// (GOOGLE_CLOUD_PROJECT): with it, lines logged with a request's trace
	// carry logging.googleapis.com/trace, so Cloud Logging nests them under
	// the request. Empty: no trace fields.
	ProjectID string
	// Service names the process in Error Reporting (serviceContext.service):
	// replication-drain, replication-verify, replication-job.
	Service string
}

// Bounds of what one line holds, whatever the input: Cloud Logging refuses
// an entry over 256 KB, and a value an outsider controls (a path, a token's
// key id, a claim) must not make lines, or the bill, grow with it.
const (
	// MaxValueBytes bounds a string value (an error's text included): a
	// longer one is cut at a character boundary and marked with how many
	// bytes were left out.
	MaxValueBytes = 2048
	// MaxLineBytes bounds a whole line: a longer one is replaced by one
	// that keeps its severity, message and time and says how long it was.
	MaxLineBytes = 64 << 10
)

// New returns a JSON logger writing to w with Cloud Logging's field names:
// "severity" (DEBUG, INFO, WARNING, ERROR), "message" and "time"; the
// request's trace (see WithTrace), a "workspace" attribute also as the
// entry's label (logging.googleapis.com/labels), and ERROR lines in the
// shape Error Reporting picks up (@type ReportedErrorEvent, serviceContext).
// Every string value is at most MaxValueBytes and every line at most
// MaxLineBytes.
func New(w io.Writer, cfg Config) *slog.Logger {
	return slog.New(&handler{cfg: cfg, inner: slog.NewJSONHandler(&boundedWriter{w: w}, &slog.HandlerOptions{
		Level: cfg.Level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			a = bounded(a)
			if len(groups) > 0 {
				return a
			}
			switch a.Key {
			case slog.MessageKey:
				a.Key = "message"
			case slog.LevelKey:
				a.Key = "severity"
				if l, ok := a.Value.Any().(slog.Level); ok {
					a.Value = slog.StringValue(severity(l))
				}
			}
			return a
		},
	})})
}

// bounded cuts an attribute's string value (or error text) to
// MaxValueBytes.
func bounded(a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindString:
		if s := a.Value.String(); len(s) > MaxValueBytes {
			a.Value = slog.StringValue(Truncate(s, MaxValueBytes))
		}
	case slog.KindAny:
		if err, ok := a.Value.Any().(error); ok {
			a.Value = slog.StringValue(Truncate(err.Error(), MaxValueBytes))
		}
	}
	return a
}

// Truncate cuts s to at most n bytes (at a character boundary), saying how
// many bytes were left out.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := max(n-40, 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("…[%d bytes left out]", len(s)-cut)
}

// Untrusted is a string an outsider chose (a path segment, a key id, a
// claim), as a log value: quoted, so that control characters and look-alike
// text show for what they are, and cut to 128 bytes.
func Untrusted(s string) string { return strconv.Quote(Truncate(s, 128)) }

// boundedWriter replaces a line longer than MaxLineBytes with a short one:
// its severity, message and time, and its length. The JSON handler writes
// each line with one Write.
type boundedWriter struct{ w io.Writer }

func (b *boundedWriter) Write(p []byte) (int, error) {
	if len(p) <= MaxLineBytes {
		return b.w.Write(p)
	}
	var head struct {
		Time     string `json:"time"`
		Severity string `json:"severity"`
		Message  string `json:"message"`
	}
	_ = json.Unmarshal(p, &head)
	line, _ := json.Marshal(map[string]any{"time": head.Time, "severity": head.Severity, "message": Truncate(head.Message, MaxValueBytes),
		"log_line_left_out_bytes": len(p)})
	if _, err := b.w.Write(append(line, '\n')); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Keys of Cloud Logging's special fields and Error Reporting's.
const (
	keyTrace        = "logging.googleapis.com/trace"
	keySpanID       = "logging.googleapis.com/spanId"
	keyTraceSampled = "logging.googleapis.com/trace_sampled"
	keyLabels       = "logging.googleapis.com/labels"
	keyType         = "@type"
	keyService      = "serviceContext"
	// reportedErrorEvent marks a line as an error for Error Reporting.
	reportedErrorEvent = "type.googleapis.com/google.devtools.clouderrorreporting.v1beta1.ReportedErrorEvent"
)

// reserved are the top-level keys of a line's own fields.
var reserved = map[string]bool{slog.LevelKey: true, slog.MessageKey: true, slog.TimeKey: true, slog.SourceKey: true,
	"severity": true, "message": true, keyTrace: true, keySpanID: true, keyTraceSampled: true, keyLabels: true,
	keyType: true, keyService: true}

// handler writes Cloud Logging's special fields and keeps the caller's
// attributes from taking their place: an attribute keyed like one of them
// ("level", "msg", "time", "severity", …) is written as "attr_<key>".
type handler struct {
	cfg   Config
	inner slog.Handler
	// workspace is a "workspace" attribute given to WithAttrs.
	workspace string
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	workspace := h.workspace
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "workspace" && a.Value.Kind() == slog.KindString {
			workspace = a.Value.String()
		}
		out.AddAttrs(rename(a))
		return true
	})
	if t, ok := TraceFrom(ctx); ok && h.cfg.ProjectID != "" {
		out.AddAttrs(slog.String(keyTrace, "projects/"+h.cfg.ProjectID+"/traces/"+t.TraceID))
		if t.SpanID != "" {
			out.AddAttrs(slog.String(keySpanID, t.SpanID))
		}
		out.AddAttrs(slog.Bool(keyTraceSampled, t.Sampled))
	}
	if workspace != "" {
		out.AddAttrs(slog.Any(keyLabels, map[string]string{"workspace": Truncate(workspace, 128)}))
	}
	if r.Level >= slog.LevelError {
		out.AddAttrs(slog.String(keyType, reportedErrorEvent))
		if h.cfg.Service != "" {
			out.AddAttrs(slog.Any(keyService, map[string]string{"service": h.cfg.Service}))
		}
	}
	return h.inner.Handle(ctx, out)
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	renamed := make([]slog.Attr, len(attrs))
	workspace := h.workspace
	for i, a := range attrs {
		if a.Key == "workspace" && a.Value.Kind() == slog.KindString {
			workspace = a.Value.String()
		}
		renamed[i] = rename(a)
	}
	return &handler{cfg: h.cfg, inner: h.inner.WithAttrs(renamed), workspace: workspace}
}

func (h *handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &grouped{inner: h.inner.WithGroup(name)}
}

func rename(a slog.Attr) slog.Attr {
	if reserved[a.Key] {
		a.Key = "attr_" + a.Key
	}
	return a
}

// grouped is the handler inside a group, where no key clashes.
type grouped struct{ inner slog.Handler }

func (g *grouped) Enabled(ctx context.Context, l slog.Level) bool  { return g.inner.Enabled(ctx, l) }
func (g *grouped) Handle(ctx context.Context, r slog.Record) error { return g.inner.Handle(ctx, r) }
func (g *grouped) WithAttrs(a []slog.Attr) slog.Handler            { return &grouped{inner: g.inner.WithAttrs(a)} }
func (g *grouped) WithGroup(n string) slog.Handler                 { return &grouped{inner: g.inner.WithGroup(n)} }

func severity(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "ERROR"
	case l >= slog.LevelWarn:
		return "WARNING"
	case l >= slog.LevelInfo:
		return "INFO"
	}
	return "DEBUG"
}

// ParseLevel parses a log level name (DEBUG, INFO, WARN or ERROR, any case;
// WARNING as Cloud Logging names it); empty is INFO.
func ParseLevel(name string) (slog.Level, error) {
	if strings.EqualFold(name, "WARNING") {
		return slog.LevelWarn, nil
	}
	var l slog.Level
	if name == "" {
		return slog.LevelInfo, nil
	}
	if err := l.UnmarshalText([]byte(name)); err != nil {
		return 0, fmt.Errorf("%q is not a log level (DEBUG, INFO, WARN, ERROR)", name)
	}
	return l, nil
}
