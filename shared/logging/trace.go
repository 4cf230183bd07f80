package logging

import (
	"context"
	"net/http"
	"regexp"
	"strconv"
	"strings"
)

// Trace is a request's trace context, as Cloud Logging links entries to it.
type Trace struct {
	// TraceID is 32 lower-case hex digits.
	TraceID string
	// SpanID is 16 lower-case hex digits (empty when the caller sent none).
	SpanID string
	// Sampled is the caller's sampling decision.
	Sampled bool
}

type traceKey struct{}

// WithTrace returns ctx carrying t: lines logged with it carry the trace.
func WithTrace(ctx context.Context, t Trace) context.Context {
	return context.WithValue(ctx, traceKey{}, t)
}

// TraceFrom returns the trace ctx carries.
func TraceFrom(ctx context.Context) (Trace, bool) {
	t, ok := ctx.Value(traceKey{}).(Trace)
	return t, ok
}

var (
	traceparentPattern = regexp.MustCompile(`^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$`)
	cloudTracePattern  = regexp.MustCompile(`^([0-9a-fA-F]{32})(?:/([0-9]{1,20}))?(?:;o=([01]))?$`)
)

// TraceFromRequest reads a request's trace context: the W3C traceparent
// header, or else Google's X-Cloud-Trace-Context (TRACE_ID/SPAN_ID;o=1, the
// span id in decimal). Malformed or all-zero ids are ignored.
func TraceFromRequest(r *http.Request) (Trace, bool) {
	if m := traceparentPattern.FindStringSubmatch(strings.TrimSpace(r.Header.Get("traceparent"))); m != nil && m[1] != "ff" {
		if m[2] == strings.Repeat("0", 32) || m[3] == strings.Repeat("0", 16) {
			return Trace{}, false
		}
		flags, _ := strconv.ParseUint(m[4], 16, 8)
		return Trace{TraceID: m[2], SpanID: m[3], Sampled: flags&1 == 1}, true
	}
	m := cloudTracePattern.FindStringSubmatch(strings.TrimSpace(r.Header.Get("X-Cloud-Trace-Context")))
	if m == nil || strings.Trim(m[1], "0") == "" {
		return Trace{}, false
	}
	t := Trace{TraceID: strings.ToLower(m[1]), Sampled: m[3] == "1"}
	if m[2] != "" {
		if span, err := strconv.ParseUint(m[2], 10, 64); err == nil && span != 0 {
			t.SpanID = strconv.FormatUint(span, 16)
			t.SpanID = strings.Repeat("0", 16-len(t.SpanID)) + t.SpanID
		}
	}
	return t, true
}

// Traced returns r with its trace (see TraceFromRequest) in its context,
// so that every line logged for it carries the trace.
func Traced(r *http.Request) *http.Request {
	if t, ok := TraceFromRequest(r); ok {
		return r.WithContext(WithTrace(r.Context(), t))
	}
	return r
}
