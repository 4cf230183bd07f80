// Package logging builds the project's structured logger: JSON lines on
// stdout in Cloud Logging's shape (severity, message, time), so Cloud Run
// and Cloud Functions parse each line into a structured entry.
package logging

import (
	"io"
	"log/slog"
)

// New returns a JSON logger writing to w at level, with Cloud Logging's
// field names: "severity" (DEBUG, INFO, WARNING, ERROR) and "message".
func New(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{
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
				a.Value = slog.StringValue(severity(a.Value.Any().(slog.Level)))
			}
			return a
		},
	}))
}

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
