package sandbox

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/segmentstream/ontology-replication/shared/delivery"
)

// Progress shows a local run as it goes, on stderr: on a terminal one line
// refreshed in place (the phase, commits, published, landed, verified of
// captured, and the two lags); elsewhere a line per phase. It keeps the
// largest lags it saw for the summary.
type Progress struct {
	w        io.Writer
	Terminal bool
	l        *Local
	Commits  func() int64

	// OnSample, when set, receives each sample's figures (the chaos
	// run's timeline).
	OnSample func(s Sampled)

	mu         sync.Mutex
	phase      string
	why        string
	maxPending time.Duration
	maxVerify  time.Duration
	last       string
}

// newProgress returns l's live line, drawn to w.
func newProgress(w io.Writer, l *Local) *Progress {
	return &Progress{w: w, Terminal: isTerminal(w), l: l, Commits: func() int64 { return 0 }}
}

// isTerminal reports whether w is a terminal (not a pipe, a file or
// /dev/null).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// Enter starts a phase: in a pipe its line is written now.
func (p *Progress) Enter(phase, why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.phase, p.why = phase, why
	line := phase
	if why != "" {
		line += " (" + why + ")"
	}
	if p.Terminal {
		fmt.Fprint(p.w, "\r\033[K"+line)
	} else {
		fmt.Fprintln(p.w, p.l.Config.Command+": "+line)
	}
}

// EnterOrExplain enters the phase, or gives the phase it is in a new
// reason; in a pipe each change is a line.
func (p *Progress) EnterOrExplain(phase, why string) {
	p.mu.Lock()
	changed := phase != p.phase || why != p.why
	p.mu.Unlock()
	if changed {
		p.Enter(phase, why)
	}
}

// run samples the pipeline every 250 ms until ctx ends: on a terminal it
// redraws the line; always it records the largest lags.
func (p *Progress) run(ctx context.Context) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if p.Terminal {
				fmt.Fprint(p.w, "\r\033[K")
			}
			return
		case <-tick.C:
		}
		line := p.sample(ctx)
		if p.Terminal && line != "" {
			fmt.Fprint(p.w, "\r\033[K"+fit(line, terminalWidth(p.w)))
		}
	}
}

// sample reads the figures once and returns the live line.
func (p *Progress) sample(ctx context.Context) string {
	l := p.l
	if l.Svc == nil || l.Pubsub == nil || l.Wh == nil {
		return p.phaseLine("")
	}
	status, err := l.Svc.Status(ctx, LocalWorkspace, "", 0)
	if err != nil {
		return p.phaseLine("")
	}
	pendingLag, verifyLag := ages(status, time.Now())
	p.mu.Lock()
	p.maxPending = max(p.maxPending, pendingLag)
	if !l.agedDeadLetter.Load() || verifyLag < 15*time.Minute {
		// Not the dead-lettered event's, whose acceptance the demo moves 16
		// minutes back.
		p.maxVerify = max(p.maxVerify, verifyLag)
	}
	p.mu.Unlock()
	published := 0
	for _, m := range l.Pubsub.Messages() {
		if m.Topic == LocalTopic {
			published++
		}
	}
	landed, _, _ := l.Wh.Counts(ctx)
	if p.OnSample != nil {
		p.OnSample(Sampled{At: time.Now(), Commits: p.Commits(), Published: published, landed: landed, DeliveryLag: pendingLag, VerificationLag: verifyLag})
	}
	verifyNote := seconds(verifyLag)
	if l.agedDeadLetter.Load() && verifyLag >= 15*time.Minute {
		verifyNote += " (the dead-lettered event, moved 16 minutes back)"
	}
	return p.phaseLine(fmt.Sprintf("lags %s / %s · %d commits · %d published · %d landed · %d/%d verified",
		seconds(pendingLag), verifyNote, p.Commits(), published, landed, status.Verified, status.Total))
}

// phaseLine is the live line: the figures first, led by the delivery and
// verification lags (what a person watches, and what a narrow terminal
// must not cut), then the phase and why it waits.
func (p *Progress) phaseLine(figures string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	line := p.phase
	if p.why != "" {
		line += " (" + p.why + ")"
	}
	if figures != "" {
		line = figures + " · " + line
	}
	return line
}

// terminalWidth is w's width in columns (80 when it cannot be read).
func terminalWidth(w io.Writer) int {
	if f, ok := w.(*os.File); ok {
		if cols, _, err := term.GetSize(int(f.Fd())); err == nil && cols > 0 {
			return cols
		}
	}
	return 80
}

// fit cuts a live line to width columns (one less: a line that fills the
// last column wraps on some terminals, and \r then redraws the wrong one),
// ending it with "…" when cut.
func fit(line string, width int) string {
	runes := []rune(line)
	if width < 2 || len(runes) < width {
		return line
	}
	return string(runes[:width-2]) + "…"
}

// Sampled is one sample's figures.
type Sampled struct {
	At                           time.Time
	Commits                      int64
	Published                    int
	landed                       int64
	DeliveryLag, VerificationLag time.Duration
}

// Lags returns the largest delivery and verification lags seen.
func (p *Progress) Lags() (pending, verify time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.maxPending, p.maxVerify
}

func events(n int64) string {
	if n == 1 {
		return "1 event"
	}
	return fmt.Sprintf("%d events", n)
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

// WaitingReason says why full verification is not there yet, from the
// figures: what is left and what it waits for.
func WaitingReason(f delivery.WorkspaceStatus, deadLettered bool) string {
	switch {
	case f.Pending > 0:
		return fmt.Sprintf("%s still to publish", events(f.Pending))
	case f.Unverified > 0 && f.DueVerifications == 0:
		return fmt.Sprintf("%s published and not found in the warehouse yet: the verifier looks again 30 s after an event was first found absent", events(f.Unverified))
	case f.Unverified > 0:
		return fmt.Sprintf("%s published, to be looked up in the warehouse", events(f.Unverified))
	case !deadLettered:
		return "the dead-lettered event's retry: the verifier sends it back to pending 15 minutes after its acceptance (fast-forwarded here)"
	}
	return ""
}

// ages is how long the oldest pending event and the oldest unverified one
// have waited.
func ages(s delivery.WorkspaceStatus, now time.Time) (pending, unverified time.Duration) {
	if !s.OldestPending.IsZero() {
		pending = max(now.Sub(s.OldestPending), 0)
	}
	if !s.OldestUnverified.IsZero() {
		unverified = max(now.Sub(s.OldestUnverified), 0)
	}
	return pending, unverified
}

// Note prints a line of its own (the chaos run's timeline): on a terminal
// above the refreshed line.
func (p *Progress) Note(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.Terminal {
		fmt.Fprint(p.w, "\r\033[K"+line+"\n")
		return
	}
	fmt.Fprintln(p.w, line)
}
