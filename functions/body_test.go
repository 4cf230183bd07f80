package functions

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// slowBody is what one connection that announces a body got: its answer's
// status, when the answer came and when the server cut the connection
// (from when the headers were sent).
type slowBody struct {
	status        int
	answered, cut time.Duration
	err           error
}

// sendSlowBody opens a connection to addr, sends a request announcing a
// 100,000-byte body, and then a byte of it every interval (never, if
// interval is 0) until the server closes the connection or 20 s pass.
func sendSlowBody(addr, method, path string, headers map[string]string, interval time.Duration) slowBody {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return slowBody{err: err}
	}
	defer conn.Close()
	var req strings.Builder
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: drain.test\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n", method, path)
	for k, v := range headers {
		fmt.Fprintf(&req, "%s: %s\r\n", k, v)
	}
	req.WriteString("\r\n{")
	start := time.Now()
	if _, err := conn.Write([]byte(req.String())); err != nil {
		return slowBody{err: err}
	}
	stop := make(chan struct{})
	defer close(stop)
	if interval > 0 {
		go func() {
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					if _, err := conn.Write([]byte(" ")); err != nil {
						return
					}
				}
			}
		}()
	}
	_ = conn.SetReadDeadline(start.Add(20 * time.Second))
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return slowBody{err: fmt.Errorf("no answer: %w", err)}
	}
	out := slowBody{status: resp.StatusCode, answered: time.Since(start)}
	_ = resp.Body.Close()
	// The server cuts the connection: a read ends (EOF or reset) well
	// before the 20 s deadline, which is an error of its own.
	_, err = r.ReadByte()
	for err == nil {
		_, err = r.ReadByte()
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		out.err = fmt.Errorf("the connection was still open after 20 s")
	}
	out.cut = time.Since(start)
	return out
}

// TestASlowBodyHoldsNeitherTheAnswerNorTheConnection: 200 connections that
// announce a body and trickle it (a byte every 2 s) or send none get their
// answer at once where no body is needed (the drain, a refused caller) and
// a 408 when it is (the verifier), and each is cut within BodyReadTimeout
// of its start, well within 15 s; valid wake-ups meanwhile are answered
// 200 as without them.
func TestASlowBodyHoldsNeitherTheAnswerNorTheConnection(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	srv := httptest.NewServer(h.handler)
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	ws := h.spaces["w1"]
	drain := "/api/internal/v1/workspaces/w1/ontology/replication/drain"
	valid := map[string]string{headerIdentity: h.token(ws.subject), headerOrganization: ws.org}
	cases := []struct {
		name           string
		method, path   string
		headers        map[string]string
		interval       time.Duration
		status         int
		answeredAtOnce bool // before the body's time is up
		connections    int
	}{
		{"drain, unauthenticated, trickling", http.MethodPost, drain, nil, 2 * time.Second, http.StatusUnauthorized, true, 60},
		{"drain, unauthenticated, silent", http.MethodPost, drain, nil, 0, http.StatusUnauthorized, true, 40},
		{"drain, valid token, trickling", http.MethodPost, drain, valid, 2 * time.Second, http.StatusOK, true, 50},
		{"verifier, trickling", http.MethodPost, "/Verify", nil, 2 * time.Second, http.StatusRequestTimeout, false, 50},
	}
	// Valid wake-ups, as the SDK sends them (no body), before and during.
	wake := func() time.Duration {
		started := time.Now()
		req, err := http.NewRequest(http.MethodPost, srv.URL+drain, nil)
		require.NoError(t, err)
		for k, v := range valid {
			req.Header.Set(k, v)
		}
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return time.Since(started)
	}
	median := func(n int) time.Duration {
		var d []time.Duration
		for range n {
			d = append(d, wake())
		}
		slices.Sort(d)
		return d[len(d)/2]
	}
	before := median(20)

	var wg sync.WaitGroup
	results := make([][]slowBody, len(cases))
	for i, c := range cases {
		results[i] = make([]slowBody, c.connections)
		for j := range c.connections {
			wg.Go(func() { results[i][j] = sendSlowBody(addr, c.method, c.path, c.headers, c.interval) })
		}
	}
	during := median(20)
	wg.Wait()
	t.Logf("valid wake-ups answered in %v (median) without the slow bodies, %v beside 200 of them", before, during)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, r := range results[i] {
				require.NoError(t, r.err)
				require.Equal(t, c.status, r.status)
				if c.answeredAtOnce {
					require.Less(t, r.answered, BodyReadTimeout, "the answer waited for a body it does not need")
				}
				require.Less(t, r.cut, 15*time.Second, "a connection trickling a body held on")
			}
		})
	}
}

// TestTheVerifierBoundsItsBody: a body past MaxBodyBytes is refused 413,
// not cut short and parsed; one within it is read whole.
func TestTheVerifierBoundsItsBody(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cases := []struct {
		name   string
		body   string
		status int
	}{
		{"within the bound", `{"workspace": "w1"}` + strings.Repeat(" ", MaxBodyBytes-64), http.StatusOK},
		{"past the bound", `{"workspace": "w1"}` + strings.Repeat(" ", MaxBodyBytes), http.StatusRequestEntityTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body := h.verifyRaw(c.body)
			require.Equal(t, c.status, status, body)
		})
	}
}
