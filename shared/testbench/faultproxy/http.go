package faultproxy

import (
	"net/http"
	"sync/atomic"
	"time"
)

// HTTPFault is what the HTTP fault handler does to a request.
type HTTPFault int32

// The HTTP fault handler's faults.
const (
	// HTTPPass serves the request.
	HTTPPass HTTPFault = iota
	// HTTPError answers 503 with a Google API error body.
	HTTPError
	// HTTPSlow holds the request until the client gives up or Hold has
	// passed, then serves it.
	HTTPSlow
	// HTTPFail answers 400 with a Google API error body, which the
	// BigQuery client does not retry: the call fails at once.
	HTTPFail
	httpFaultKinds
)

func (f HTTPFault) String() string {
	return [...]string{"pass", "error_503", "slow", "fail_400"}[f]
}

// HTTP puts faults in front of an HTTP handler (a BigQuery REST server).
type HTTP struct {
	// Next serves what passes.
	Next http.Handler
	// Hold is how long a slow answer is held at most (default 30s).
	Hold   time.Duration
	fault  atomic.Int32
	counts [httpFaultKinds]atomic.Int64
	armed  [httpFaultKinds]atomic.Int64
}

// Set makes the requests from now on get f.
func (h *HTTP) Set(f HTTPFault) {
	if f != HTTPPass {
		h.armed[f].Add(1)
	}
	h.fault.Store(int32(f))
}

// Armed is how many times f was set, whether or not a request met it.
func (h *HTTP) Armed(f HTTPFault) int64 { return h.armed[f].Load() }

// Count is how many requests got f so far.
func (h *HTTP) Count(f HTTPFault) int64 { return h.counts[f].Load() }

// ServeHTTP serves r, with the fault set.
func (h *HTTP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f := HTTPFault(h.fault.Load())
	h.counts[f].Add(1)
	switch f {
	case HTTPError:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":{"code":503,"message":"faultproxy: injected backend error","status":"UNAVAILABLE","errors":[{"reason":"backendError","message":"injected"}]}}`))
		return
	case HTTPFail:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":{"code":400,"message":"faultproxy: injected failure","status":"FAILED_PRECONDITION","errors":[{"reason":"failedPrecondition","message":"injected"}]}}`))
		return
	case HTTPSlow:
		hold := h.Hold
		if hold == 0 {
			hold = 30 * time.Second
		}
		t := time.NewTimer(hold)
		defer t.Stop()
		select {
		case <-r.Context().Done():
			return
		case <-t.C:
		}
	}
	h.Next.ServeHTTP(w, r)
}
