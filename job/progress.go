package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"
)

// progressOutput decides how long work shows progress: a live line on a
// terminal, structured log lines otherwise.
type progressOutput struct {
	w   io.Writer
	tty bool
	log *slog.Logger
	now func() time.Time
}

func newProgressOutput(w io.Writer, log *slog.Logger) *progressOutput {
	tty := false
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	return &progressOutput{w: w, tty: tty, log: log, now: time.Now}
}

// logEvery is how many pages pass between two progress log lines when the
// output is not a terminal.
const logEvery = 10

// progress tracks one long operation on one workspace. Its methods may be
// called from several goroutines.
type progress struct {
	mu        sync.Mutex
	muted     bool
	out       *progressOutput
	operation string
	workspace string
	unit      string
	total     int64 // expected rows, 0 when unknown
	rows      int64
	pages     int
	started   time.Time
	printed   time.Time
}

func (o *progressOutput) start(operation, workspace, unit string, total int64) *progress {
	return &progress{out: o, operation: operation, workspace: workspace, unit: unit, total: total, started: o.now()}
}

// mute makes add count without showing anything, while another operation
// shows its progress; unmute shows it again.
func (p *progress) mute() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.muted = true
}

func (p *progress) unmute() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.muted = false
}

// add records a finished page of n rows.
func (p *progress) add(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rows += int64(n)
	p.pages++
	if p.muted {
		return
	}
	now := p.out.now()
	if p.out.tty {
		if now.Sub(p.printed) >= 100*time.Millisecond {
			p.printed = now
			fmt.Fprintf(p.out.w, "\r\033[K%s", p.line(now))
		}
		return
	}
	if p.pages%logEvery == 0 {
		p.out.log.Info(p.operation+" progress", p.attrs(now)...)
	}
}

// done prints the summary.
func (p *progress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.out.now()
	if p.out.tty {
		fmt.Fprintf(p.out.w, "\r\033[K%s, done\n", p.line(now))
		return
	}
	p.out.log.Info(p.operation+" done", p.attrs(now)...)
}

func (p *progress) rate(now time.Time) float64 {
	secs := now.Sub(p.started).Seconds()
	if secs <= 0 {
		return 0
	}
	return float64(p.rows) / secs
}

func (p *progress) eta(now time.Time) time.Duration {
	r := p.rate(now)
	if p.total <= 0 || r <= 0 || p.rows >= p.total {
		return 0
	}
	return time.Duration(float64(p.total-p.rows) / r * float64(time.Second)).Round(time.Second)
}

func (p *progress) line(now time.Time) string {
	s := fmt.Sprintf("%s %s: %d pages, %d", p.operation, p.workspace, p.pages, p.rows)
	if p.total > 0 {
		s += fmt.Sprintf("/%d", p.total)
	}
	s += fmt.Sprintf(" %s, %.0f %s/s", p.unit, p.rate(now), p.unit)
	if eta := p.eta(now); eta > 0 {
		s += fmt.Sprintf(", ETA %v", eta)
	}
	return s
}

func (p *progress) attrs(now time.Time) []any {
	attrs := []any{slog.String("workspace", p.workspace), slog.Int("pages", p.pages), slog.Int64(p.unit, p.rows),
		slog.Float64("rate_per_s", float64(int(p.rate(now)*10))/10), slog.Int64("elapsed_ms", now.Sub(p.started).Milliseconds())}
	if p.total > 0 {
		attrs = append(attrs, slog.Int64("total", p.total), slog.Int64("eta_s", int64(p.eta(now).Seconds())))
	}
	return attrs
}
