package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/segmentstream/ontology-replication/shared/delivery"
)

// progressOutput decides how long work shows progress: a live line on a
// terminal, structured log lines otherwise.
type progressOutput struct {
	w   io.Writer
	tty bool
	log *slog.Logger
	now func() time.Time

	mu   sync.Mutex
	live []*progress // operations running, newest last
}

func newProgressOutput(w io.Writer, log *slog.Logger) *progressOutput {
	return &progressOutput{w: w, tty: isTerminal(w), log: log, now: time.Now}
}

// fit cuts a live line to the terminal's width, so that it neither wraps
// nor leaves a tail behind when it is redrawn.
func (o *progressOutput) fit(line string) string {
	f, ok := o.w.(*os.File)
	if !ok {
		return line
	}
	width, _, err := term.GetSize(int(f.Fd()))
	if err != nil || width <= 1 {
		return line
	}
	if r := []rune(line); len(r) > width-1 {
		return string(r[:width-2]) + "…"
	}
	return line
}

// logEvery is how many pages pass between two progress log lines when the
// output is not a terminal.
const logEvery = 10

// progress tracks one operation on one workspace; it implements
// delivery.Tracker. Its methods may be called from several goroutines.
type progress struct {
	mu        sync.Mutex
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

// Start implements delivery.Progress. On a terminal the newest operation
// still running shows its live line.
func (o *progressOutput) Start(operation, workspace, unit string, total int64) delivery.Tracker {
	p := &progress{out: o, operation: operation, workspace: workspace, unit: unit, total: total, started: o.now()}
	o.mu.Lock()
	o.live = append(o.live, p)
	o.mu.Unlock()
	return p
}

// shows reports whether p has the terminal's live line.
func (o *progressOutput) shows(p *progress) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.live) > 0 && o.live[len(o.live)-1] == p
}

func (o *progressOutput) finished(p *progress) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i, q := range o.live {
		if q == p {
			o.live = append(o.live[:i], o.live[i+1:]...)
			return
		}
	}
}

// Add records a finished page or batch of n rows or events.
func (p *progress) Add(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rows += int64(n)
	p.pages++
	now := p.out.now()
	if p.out.tty {
		if p.out.shows(p) && now.Sub(p.printed) >= 100*time.Millisecond {
			p.printed = now
			fmt.Fprintf(p.out.w, "\r\033[K%s", p.out.fit(p.line(now)))
		}
		return
	}
	if p.pages%logEvery == 0 {
		p.out.log.Info("replication "+p.operation+" progress", p.attrs(now)...)
	}
}

// Done prints the operation's summary: "done" only when it finished; a
// stopped operation says so at WARNING, a failed one at ERROR with its
// cause (the command's error line follows with the whole of it).
func (p *progress) Done(err error) {
	p.out.finished(p)
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.out.now()
	word, level, attrs := "done", slog.LevelInfo, p.attrs(now)
	switch {
	case errors.Is(err, delivery.ErrInterrupted):
		word, level = "stopped", slog.LevelWarn
	case err != nil:
		word, level = "failed", slog.LevelError
		attrs = append(attrs, slog.String("cause", delivery.Cause(err)), slog.String("error", err.Error()))
	}
	if p.out.tty {
		fmt.Fprintf(p.out.w, "\r\033[K%s\n", p.out.fit(p.line(now)+", "+word))
		return
	}
	p.out.log.Log(context.Background(), level, "replication "+p.operation+" "+word, attrs...)
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
	s := fmt.Sprintf("%s %s: %s, %d", p.operation, p.workspace, count(p.pages, "page"), p.rows)
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
