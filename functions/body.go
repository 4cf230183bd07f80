package functions

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// A request's body. The SDK's wake-up has none; the scheduler's verifier
// call carries a small JSON object, sent with its headers. A client that
// announces a body and then sends it slowly, or not at all, must hold
// neither the answer nor its connection: Go's server otherwise reads what
// a handler left of a body (up to 256 KB) before it writes the answer, and
// with no read time-out it waits for as long as the client trickles.
const (
	// BodyReadTimeout bounds the time a client has to send a request's
	// body, counted from when the handler starts: ample for the
	// scheduler's few bytes, short enough that a connection which
	// trickles a body is cut within seconds.
	BodyReadTimeout = 5 * time.Second
	// MaxBodyBytes bounds a request's body: a verifier call names a
	// workspace or a shard in well under a kilobyte.
	MaxBodyBytes = 64 << 10
)

// boundBody bounds the body a request announces, in time (BodyReadTimeout)
// and size (MaxBodyBytes), and marks the connection to be closed after the
// answer, so that the answer does not wait for a body the handler leaves
// unread (the drain never reads one; a refused call's is never read).
// readBody, once it has the whole body, keeps the connection.
func boundBody(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody {
		return
	}
	// A recorder (tests) supports no deadline; a real connection does.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(BodyReadTimeout))
	r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
	w.Header().Set("Connection", "close")
}

// errBodyTooSlow and errBodyTooLarge are the failures of readBody that are
// the client's: the first answers 408, the second 413.
var (
	errBodyTooSlow  = fmt.Errorf("the request's body did not arrive within %v", BodyReadTimeout)
	errBodyTooLarge = fmt.Errorf("the request's body is larger than %d bytes", MaxBodyBytes)
)

// readBody reads a body bound by boundBody. Once it has it all, the
// connection's read deadline is lifted (a verifier pass outlasts it) and
// the connection may be kept alive.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(r.Body)
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, errBodyTooLarge
	case isTimeout(err):
		return nil, fmt.Errorf("%w: %w", errBodyTooSlow, err)
	case err != nil:
		return nil, fmt.Errorf("read the request's body: %w", err)
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	w.Header().Del("Connection")
	return body, nil
}

// isTimeout reports a read that met its deadline.
func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
