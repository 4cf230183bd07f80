package logging

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
)

// NewText returns a logger for a person at a terminal: one line per record,
// "15:04:05 WARNING message key=value …" (a value with a space or a quote
// quoted), string values bounded as New bounds them. What a machine reads
// (Cloud Logging, a pipe, a file) gets New's JSON.
func NewText(w io.Writer, cfg Config) *slog.Logger {
	return slog.New(&textHandler{w: w, mu: &sync.Mutex{}, level: cfg.Level})
}

type textHandler struct {
	w      io.Writer
	mu     *sync.Mutex // one line at a time, shared by the handler's copies
	level  slog.Level
	prefix string // the groups opened, "a.b."
	attrs  string // the attributes added, formatted
}

func (h *textHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *textHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Time.Format(time.TimeOnly))
	b.WriteByte(' ')
	b.WriteString(severity(r.Level))
	b.WriteByte(' ')
	b.WriteString(Truncate(r.Message, MaxValueBytes))
	b.WriteString(h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		writeAttr(&b, h.prefix, a)
		return true
	})
	b.WriteByte('\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := io.WriteString(h.w, b.String())
	return err
}

func (h *textHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	var b strings.Builder
	for _, a := range attrs {
		writeAttr(&b, h.prefix, a)
	}
	c := *h
	c.attrs += b.String()
	return &c
}

func (h *textHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.prefix += name + "."
	return &c
}

// writeAttr writes " key=value", a group's attributes each under its
// name.
func writeAttr(b *strings.Builder, prefix string, a slog.Attr) {
	a.Value = a.Value.Resolve()
	if a.Value.Kind() == slog.KindGroup {
		for _, g := range a.Value.Group() {
			writeAttr(b, prefix+a.Key+".", g)
		}
		return
	}
	if a.Equal(slog.Attr{}) {
		return
	}
	a = bounded(a)
	v := a.Value.String()
	if v == "" || strings.ContainsAny(v, " \"=\n\t") {
		v = strconv.Quote(v)
	}
	b.WriteByte(' ')
	b.WriteString(prefix + a.Key)
	b.WriteByte('=')
	b.WriteString(v)
}
