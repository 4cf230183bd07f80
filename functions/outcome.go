package functions

import (
	"cmp"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/segmentstream/ontology-replication/shared/delivery"
)

// outcome collects one invocation's answer and writes it with one log line.
type outcome struct {
	ctx     context.Context
	log     *slog.Logger
	message string
	// refusals samples the lines of refused requests (nil: every line at
	// its level).
	refusals *refusals
	fields   []any
	status   int
	name     string
	body     any
	err      error
	// cause overrides delivery.Cause(err) on a 5xx line.
	cause string
}

func (o *outcome) fail(status int, name, message string, err error) {
	o.status, o.name, o.err = status, name, err
	o.body = map[string]string{"error": message}
}

func (o *outcome) ok(body any) {
	o.status, o.name, o.body = http.StatusOK, "ok", body
}

// write writes the invocation's line and its answer. A 503 (a later call
// may succeed) is a WARNING, a 500 an ERROR, each with a cause (see
// delivery.Cause) that alerts and Error Reporting group by; a 4xx is a
// WARNING. Refused callers (401, 403, 404, 405) and callers that cannot be
// checked while the token keys are unavailable (a 503) are sampled (see
// refusals).
func (o *outcome) write(w http.ResponseWriter, started time.Time) {
	fields := append(o.fields, slog.String("outcome", o.name), slog.Int("status", o.status),
		slog.Int64("duration_ms", time.Since(started).Milliseconds()))
	level := slog.LevelInfo
	switch {
	case o.refusals != nil && (refused(o.status) || o.cause == delivery.CauseKeysUnavailable):
		// A refused request costs its caller nothing, and so does one
		// that cannot be checked while the token keys cannot be fetched
		// (a 503 the caller may retry at once), so a flood of them must
		// cost nothing either: each is a DEBUG line, and at most one a
		// second per outcome and cause a WARNING carrying how many it
		// stands for.
		level = slog.LevelDebug
		if n, ok := o.refusals.admit(o.name+"/"+o.cause, time.Now()); ok {
			level = slog.LevelWarn
			fields = append(fields, slog.Int("refused", n))
		}
	case o.status == http.StatusServiceUnavailable:
		level = slog.LevelWarn
	case o.status >= 500:
		level = slog.LevelError
	case o.status >= 400:
		level = slog.LevelWarn
	}
	if o.status >= 500 {
		fields = append(fields, slog.String("cause", cmp.Or(o.cause, delivery.Cause(o.err), delivery.CauseInternal)))
	}
	if o.err != nil {
		fields = append(fields, slog.String("error", o.err.Error()))
	}
	ctx := o.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	o.log.Log(ctx, level, o.message, fields...)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(o.status)
	_ = json.NewEncoder(w).Encode(o.body)
}

// refused reports the statuses of refused callers, whose lines are sampled.
func refused(status int) bool {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed:
		return true
	}
	return false
}

// refusals counts refused requests by cause (the outcome's name) and lets
// one line a second per cause through at WARNING.
type refusals struct {
	mu sync.Mutex
	by map[string]*refusalCount
}

type refusalCount struct {
	last time.Time // when the last WARNING line was written
	n    int       // refusals since it
}

// refusalEvery is how often a cause's refusals are written at WARNING.
const refusalEvery = time.Second

// admit counts a refusal of the cause and reports whether its line is the
// cause's WARNING, with the refusals it stands for (this one included).
func (r *refusals) admit(cause string, now time.Time) (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.by == nil {
		r.by = map[string]*refusalCount{}
	}
	c := r.by[cause]
	if c == nil {
		c = &refusalCount{}
		r.by[cause] = c
	}
	c.n++
	if now.Sub(c.last) < refusalEvery {
		return 0, false
	}
	n := c.n
	c.last, c.n = now, 0
	return n, true
}
