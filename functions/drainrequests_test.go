package functions

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/logging"
	"github.com/segmentstream/ontology-replication/shared/testbench/tokenissuer"
)

func TestDrainRefusesBadCallers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withWorkspaces("w1", "w2"))
	h.products("w1", 3)
	h.products("w2", 3)
	other, err := newIssuerLike(h)
	require.NoError(t, err)
	now := time.Now()
	sign := func(c jwt.Claims) string {
		tok, err := h.issuer.Sign(c)
		require.NoError(t, err)
		return tok
	}
	base := jwt.Claims{Issuer: h.issuer.URL, Subject: "runtime-w1", Audience: jwt.Audience{"replication"},
		Expiry: jwt.NewNumericDate(now.Add(time.Minute))}
	with := func(f func(*jwt.Claims)) string { c := base; f(&c); return sign(c) }
	good := sign(base)
	parts := strings.Split(good, ".")
	path := "/api/internal/v1/workspaces/w1/ontology/replication/drain"
	cases := []struct {
		name, path, token, org string
		status                 int
	}{
		{"missing token", path, "", "org-w1", 401},
		{"malformed", path, "x.y.z", "org-w1", 401},
		{"expired", path, with(func(c *jwt.Claims) { c.Expiry = jwt.NewNumericDate(now.Add(-time.Hour)) }), "org-w1", 401},
		{"wrong issuer", path, with(func(c *jwt.Claims) { c.Issuer = "https://evil.test" }), "org-w1", 401},
		{"wrong audience", path, with(func(c *jwt.Claims) { c.Audience = jwt.Audience{"other"} }), "org-w1", 401},
		{"subject of another workspace", path, with(func(c *jwt.Claims) { c.Subject = "runtime-w2" }), "org-w1", 401},
		{"alg none", path, b64(`{"alg":"none","kid":"key-1"}`) + "." + parts[1] + ".", "org-w1", 401},
		{"unknown key id", path, other, "org-w1", 401},
		{"wrong organisation", path, good, "org-w2", 401},
		{"no organisation", path, good, "", 401},
		{"w1's token on w2", "/api/internal/v1/workspaces/w2/ontology/replication/drain", good, "org-w2", 401},
		{"unknown workspace", "/api/internal/v1/workspaces/w9/ontology/replication/drain", good, "org-w1", 401},
		{"other path", "/api/internal/v1/workspaces/w1/other", good, "org-w1", 404},
	}
	answers := map[string]map[string]any{}
	for _, c := range cases {
		code, body := h.call(http.MethodPost, c.path, c.token, c.org)
		require.Equal(t, c.status, code, c.name)
		require.Len(t, body, 1, "%s: only an error message, no detail", c.name)
		require.NotContains(t, body["error"], "runtime-w", c.name)
		answers[c.name] = body
	}
	require.Equal(t, answers["w1's token on w2"], answers["unknown workspace"],
		"an authenticated caller cannot tell a workspace that exists from one that does not")
	// The log tells them apart, and names no workspace the caller was not
	// proven to be: the path's is requested_workspace, quoted.
	for _, l := range parseLines(t, h.logs.String()) {
		if l["message"] != LogDrain || l["outcome"] == "ok" {
			continue
		}
		require.NotContains(t, l, "workspace", "a refused call's line has no workspace field (nor metric label): %v", l)
	}
	require.Contains(t, h.logs.String(), `"requested_workspace":"\"w9\"","outcome":"unknown_workspace"`)
	code, _ := h.call(http.MethodGet, path, good, "org-w1")
	require.Equal(t, http.StatusMethodNotAllowed, code)
	require.Empty(t, h.pubsub.Messages(), "no refused call published anything")
	// No database touched: the product opens a workspace's pool on its
	// first use, and a refused call opened none (not one connection of the
	// product's reached either database).
	for _, id := range []string{"w1", "w2"} {
		require.Zero(t, h.count(id, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'ontology-replication'`), "%s: a refused call connected", id)
	}
	require.Zero(t, h.count("w1", "SELECT count(*) FROM _ontology_replication_receipts"))

	// Each workspace drains only itself.
	code, _ = h.wake("w2")
	require.Equal(t, http.StatusOK, code)
	h.settle()
	require.Len(t, h.published("w2"), 3)
	require.Positive(t, h.count("w2", `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'ontology-replication'`), "the probe above sees the product's connections")
	require.Empty(t, h.published("w1"))
	require.EqualValues(t, 3, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NULL"))
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// newIssuerLike signs a workspace token with a key the JWKS does not hold.
func newIssuerLike(h *harness) (string, error) {
	other, err := tokenissuer.New(h.issuer.URL, "key-2")
	if err != nil {
		return "", err
	}
	return other.Token("runtime-w1", "replication", time.Minute)
}

func dbName(raw string) string {
	u, _ := url.Parse(raw)
	return strings.TrimPrefix(u.Path, "/")
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestLogsCarryTheRequestsTrace: every line a request logs carries its
// trace (traceparent, or X-Cloud-Trace-Context), the workspace as its
// label, and a successful invocation's line no error field; so does the
// line of the drainer the request started.
func TestLogsCarryTheRequestsTrace(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.products("w1", 3)
	ws := h.spaces["w1"]
	for _, c := range []struct {
		header, value, trace, span string
	}{
		{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"},
		{"X-Cloud-Trace-Context", "105445aa7843bc8bf206b12000100000/255;o=1", "105445aa7843bc8bf206b12000100000", "00000000000000ff"},
	} {
		t.Run(c.header, func(t *testing.T) {
			h.logs.Reset()
			req := httptest.NewRequest(http.MethodPost, "/api/internal/v1/workspaces/w1/ontology/replication/drain", nil)
			req.Header.Set(headerIdentity, h.token(ws.subject))
			req.Header.Set(headerOrganization, ws.org)
			req.Header.Set(c.header, c.value)
			rec := httptest.NewRecorder()
			h.handler.ServeHTTP(rec, req)
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			h.settle()
			var drain, run map[string]any
			for _, line := range strings.Split(strings.TrimSpace(h.logs.String()), "\n") {
				var entry map[string]any
				require.NoError(t, json.Unmarshal([]byte(line), &entry), line)
				require.Equal(t, "projects/p1/traces/"+c.trace, entry["logging.googleapis.com/trace"], line)
				require.Equal(t, c.span, entry["logging.googleapis.com/spanId"], line)
				switch entry["message"] {
				case LogDrain:
					drain = entry
				case delivery.LogDrainRun:
					run = entry
				}
			}
			require.NotNil(t, drain, "the invocation's line")
			require.Equal(t, map[string]any{"workspace": "w1"}, drain["logging.googleapis.com/labels"])
			require.Equal(t, "ok", drain["outcome"])
			require.NotContains(t, drain, "error", "no empty error field on success")
			require.NotNil(t, run, "the drainer's line")
			require.Equal(t, map[string]any{"workspace": "w1"}, run["logging.googleapis.com/labels"])
			require.Contains(t, run, "publish_ms")
		})
	}
}

// unread is a request body that counts the reads of it.
type unread struct{ reads atomic.Int64 }

func (u *unread) Read(p []byte) (int, error) {
	u.reads.Add(1)
	return copy(p, bytes.Repeat([]byte("x"), len(p))), nil
}

// TestDrainReadsNoBody: the wake-up's body, whatever it is (here an
// endless one), is never read: the drain answers from its path and
// headers, and no caller can make it buffer anything.
func TestDrainReadsNoBody(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.products("w1", 3)
	ws := h.spaces["w1"]
	body := &unread{}
	req := httptest.NewRequest(http.MethodPost, "/api/internal/v1/workspaces/w1/ontology/replication/drain", body)
	req.Header.Set(headerIdentity, h.token(ws.subject))
	req.Header.Set(headerOrganization, ws.org)
	rec := httptest.NewRecorder()
	h.handler.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Zero(t, body.reads.Load(), "the body was read")
	h.settle()
	require.Len(t, h.published("w1"), 3)
}

// parseLines parses JSON log lines.
func parseLines(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		if line == "" {
			continue
		}
		var l map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &l), line)
		out = append(out, l)
	}
	return out
}

// TestDrainTelemetryBoundedAgainstOutsiders: unauthenticated input never
// becomes a metric label or an unbounded line. 200 POSTs to random
// workspace paths, a 200 KB path and a token whose key id is 500 KB leave
// every drain line without a workspace field (the drain_invocations
// metric's label), with outcomes and causes from the code's fixed sets,
// and every line under the logger's bound.
func TestDrainTelemetryBoundedAgainstOutsiders(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for i := range 200 {
		code, _ := h.call(http.MethodPost, fmt.Sprintf("/api/internal/v1/workspaces/random-%d-%s/ontology/replication/drain", i, sha(fmt.Sprint(i))[:8]), "", "")
		require.Equal(t, http.StatusUnauthorized, code)
	}
	code, _ := h.call(http.MethodPost, "/api/internal/v1/workspaces/"+strings.Repeat("w", 200<<10)+"/ontology/replication/drain", "", "")
	require.Equal(t, http.StatusUnauthorized, code)
	bigKid := b64(`{"alg":"ES256","typ":"JWT","kid":"`+strings.Repeat("k", 500<<10)+`"}`) + "." + b64(`{"sub":"runtime-w1"}`) + ".c2ln"
	code, _ = h.call(http.MethodPost, "/api/internal/v1/workspaces/w1/ontology/replication/drain", bigKid, "org-w1")
	require.Equal(t, http.StatusUnauthorized, code)

	outcomes := map[string]bool{}
	lines := 0
	for _, raw := range strings.Split(strings.TrimSpace(h.logs.String()), "\n") {
		require.LessOrEqual(t, len(raw), logging.MaxLineBytes, "a line over the bound")
		var l map[string]any
		require.NoError(t, json.Unmarshal([]byte(raw), &l))
		if l["message"] != LogDrain {
			continue
		}
		lines++
		require.NotContains(t, l, "workspace", "no workspace label from an unauthenticated call")
		require.NotContains(t, l, "logging.googleapis.com/labels", "nor a log label")
		outcomes[l["outcome"].(string)] = true
		for k, v := range l {
			if s, ok := v.(string); ok {
				require.LessOrEqual(t, len(s), logging.MaxValueBytes, k)
			}
		}
	}
	require.Equal(t, 202, lines)
	require.Equal(t, map[string]bool{"unauthorized": true}, outcomes, "one label value, whatever the paths")
}

// TestRefusedRequestsAreSampled: a flood of unauthenticated wake-ups
// writes each at DEBUG and at most one WARNING a second per cause, which
// carries how many refusals it stands for; the count is kept, not lost.
func TestRefusedRequestsAreSampled(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	started := time.Now()
	const calls = 1000
	for range calls {
		code, _ := h.call(http.MethodPost, "/api/internal/v1/workspaces/w1/ontology/replication/drain", "", "")
		require.Equal(t, http.StatusUnauthorized, code)
	}
	elapsed := time.Since(started)
	warnings, debug, counted := 0, 0, 0
	for _, raw := range strings.Split(strings.TrimSpace(h.logs.String()), "\n") {
		var l map[string]any
		require.NoError(t, json.Unmarshal([]byte(raw), &l))
		if l["message"] != LogDrain {
			continue
		}
		require.Equal(t, "unauthorized", l["outcome"])
		switch l["severity"] {
		case "WARNING":
			warnings++
			counted += int(l["refused"].(float64))
		case "DEBUG":
			debug++
			require.NotContains(t, l, "refused")
		default:
			t.Fatalf("a refused request's line at %v", l["severity"])
		}
	}
	require.Equal(t, calls, warnings+debug, "a line for each")
	require.LessOrEqual(t, warnings, 1+int(elapsed/time.Second), "at most one WARNING a second (%v)", elapsed)
	require.Positive(t, warnings)
	require.LessOrEqual(t, counted, calls)
	require.GreaterOrEqual(t, counted, warnings)
}
