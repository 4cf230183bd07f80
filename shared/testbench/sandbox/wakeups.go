package sandbox

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The chaos run's wake-ups, as the SDK sends them and as the drain
// instances serve them. The SDK waits 5 s for an answer and only logs a
// non-2xx; the instance answers at once and its drainer carries the commit
// behind the answer. So each wake-up has two ends: the SDK's (the status
// it saw, or none: its promise), and its drain's (when the instance's
// drainer that the wake-up started or joined ended, as its lines say:
// until then a drain is in flight for it).

// WakeRecord is one commit and its wake-up.
type WakeRecord struct {
	// HistoryIDs are the commit's events (its history rows), EventIDs
	// their wire ids.
	HistoryIDs, EventIDs []string
	Committed            time.Time
	// Drain is the instance the wake-up was sent to.
	Drain int
	// Start is the instance's process the request went to (its count of
	// starts), Run and Wake the answer's drainer run and place
	// (delivery.WakeAnswer).
	Start     int64
	Run, Wake uint64
	// Restarted: the instance started another process while the request
	// was out, so which process answered is not known for sure.
	Restarted bool
	// Code is the status the SDK saw within its 5 s (0: none), and
	// Answered when.
	Code     int
	Answered time.Time
	// Sent is when the wake-up request was sent, and Ended when the
	// instance answered it, whenever that was (zero: still in flight),
	// with EndCode (0: no answer).
	Sent, Ended time.Time
	EndCode     int
	// resolved: every event was seen published, or set aside.
	resolved bool
}

// Promised reports whether the SDK got a 2xx: the commit is then the
// promise of a drain in flight.
func (w *WakeRecord) Promised() bool { return w.Code/100 == 2 }

// WakeLedger is every wake-up of the run.
type WakeLedger struct {
	// InFlight counts the wake-up requests not ended yet (past the SDK's
	// 5 s too), started those ever sent: no drain of a wake-up runs while
	// inFlight is 0.
	InFlight, Started atomic.Int64
	// PerDrain counts the requests in flight by drain instance.
	PerDrain [8]atomic.Int64

	mu  sync.Mutex
	All []*WakeRecord
}

// sdkWait is how long the SDK waits for a wake-up's answer.
const sdkWait = 5 * time.Second

// Send wakes the drain at url for rec's commit as the SDK does and
// returns once the SDK would have (its answer, or 5 s); the request itself
// goes on until the instance answers, and the ledger counts it in flight
// until then.
func (wl *WakeLedger) Send(ctx context.Context, l *Local, url, token string, rec *WakeRecord) {
	wl.mu.Lock()
	rec.Sent = time.Now()
	wl.All = append(wl.All, rec)
	wl.mu.Unlock()
	wl.Started.Add(1)
	wl.InFlight.Add(1)
	wl.PerDrain[rec.Drain].Add(1)
	answer := make(chan int, 1)
	go func() {
		defer wl.InFlight.Add(-1)
		defer wl.PerDrain[rec.Drain].Add(-1)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		proc := l.DrainProcs[rec.Drain]
		starts := proc.starts.Load()
		ans := l.post(rctx, url, token)
		if ans.started {
			proc.Running.Add(1)
		}
		wl.mu.Lock()
		rec.Start, rec.Run, rec.Wake = starts, ans.run, ans.wake
		rec.Restarted = proc.starts.Load() != starts
		wl.mu.Unlock()
		answer <- ans.status
		// The drain's end: the instance's drainers have ended (their
		// lines say so), or the process ended with them, or a minute.
		if ans.status/100 == 2 {
			proc.awaitDrainers(rctx, starts)
		}
		wl.mu.Lock()
		rec.Ended, rec.EndCode = time.Now(), ans.status
		wl.mu.Unlock()
	}()
	timer := time.NewTimer(sdkWait)
	defer timer.Stop()
	select {
	case code := <-answer:
		wl.record(rec, code)
	case <-timer.C:
		wl.record(rec, 0) // the SDK gave up: logged as deferred
	case <-ctx.Done():
		wl.record(rec, 0)
	}
}

func (wl *WakeLedger) record(rec *WakeRecord, code int) {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	rec.Code, rec.Answered = code, time.Now()
}

// Open returns the promised wake-ups answered before t whose events were
// not all seen delivered yet.
func (wl *WakeLedger) Open(t time.Time) []*WakeRecord {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	var out []*WakeRecord
	for _, w := range wl.All {
		if !w.resolved && w.Promised() && w.Answered.Before(t) {
			out = append(out, w)
		}
	}
	return out
}

// Records returns a copy of every wake-up recorded.
func (wl *WakeLedger) Records() []WakeRecord {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	out := make([]WakeRecord, len(wl.All))
	for i, w := range wl.All {
		out[i] = *w
	}
	return out
}

// Resolve marks wake-ups resolved.
func (wl *WakeLedger) Resolve(ws []*WakeRecord) {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	for _, w := range ws {
		w.resolved = true
	}
}

// Codes counts the SDK's answers by status ("no_answer" for none).
func (wl *WakeLedger) Codes() map[string]int {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	out := map[string]int{}
	for _, w := range wl.All {
		key := "no_answer"
		if w.Code != 0 {
			key = strconv.Itoa(w.Code)
		}
		out[key]++
	}
	return out
}

// AnswerSummary is how long the SDK waited for the wake-ups' answers
// (milliseconds; one it gave up on counts its whole 5 s).
type AnswerSummary struct {
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
}

// Answers summarises the wait for every wake-up the SDK has finished with.
func (wl *WakeLedger) Answers() AnswerSummary {
	wl.mu.Lock()
	var waits []time.Duration
	for _, w := range wl.All {
		if !w.Answered.IsZero() {
			waits = append(waits, min(w.Answered.Sub(w.Sent), sdkWait))
		}
	}
	wl.mu.Unlock()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return AnswerSummary{P50Ms: ms(Quantile(waits, 0.5)), P99Ms: ms(Quantile(waits, 0.99)), MaxMs: ms(Quantile(waits, 1))}
}

// Quantile is the q-quantile of ds (0 when empty).
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
