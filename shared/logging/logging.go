// Package logging builds the project's structured logger: JSON lines on
// stdout in Cloud Logging's shape (severity, message, time), so Cloud Run
// and Cloud Functions parse each line into a structured entry.
package logging

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// New returns a JSON logger writing to w at level, with Cloud Logging's
// field names: "severity" (DEBUG, INFO, WARNING, ERROR) and "message".
func New(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(&handler{inner: slog.NewJSONHandler(w, &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
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

// reserved are the top-level keys of a line's own fields.
var reserved = map[string]bool{slog.LevelKey: true, slog.MessageKey: true, slog.TimeKey: true, slog.SourceKey: true,
	"severity": true, "message": true}

// handler keeps the caller's attributes from taking the place of a line's
// own fields: an attribute keyed like one of them ("level", "msg", "time",
// "severity", …) is written as "attr_<key>".
type handler struct{ inner slog.Handler }

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	clash := false
	r.Attrs(func(a slog.Attr) bool { clash = clash || reserved[a.Key]; return !clash })
	if clash {
		out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
		r.Attrs(func(a slog.Attr) bool { out.AddAttrs(rename(a)); return true })
		r = out
	}
	return h.inner.Handle(ctx, r)
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	renamed := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		renamed[i] = rename(a)
	}
	return &handler{inner: h.inner.WithAttrs(renamed)}
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
