package functions

import (
	"cmp"
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/tokenissuer"
)

const (
	schedulerEmail = "replication-scheduler@p1.iam.gserviceaccount.com"
	verifierURL    = "https://replication-verify-123.europe-west1.run.app"
)

// googleKeys serves an issuer's keys wherever the idtoken package looks for
// Google's (every request of the client goes to the in-test server), and
// fails while down is set.
func googleKeys(t *testing.T, google *tokenissuer.Issuer, down *atomic.Bool) (*http.Client, *atomic.Int64) {
	t.Helper()
	var fetches atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		if down.Load() {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		google.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	target, err := url.Parse(srv.URL)
	require.NoError(t, err)
	return &http.Client{Transport: rewrite{target: target}}, &fetches
}

// rewrite sends every request to target.
type rewrite struct{ target *url.URL }

func (r rewrite) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.URL.Scheme, req.URL.Host, req.Host = r.target.Scheme, r.target.Host, r.target.Host
	return http.DefaultTransport.RoundTrip(req)
}

// googleToken is a Google OIDC token as Cloud Scheduler sends it, with
// changes.
func googleToken(t *testing.T, signer *tokenissuer.Issuer, change func(map[string]any)) string {
	t.Helper()
	now := time.Now()
	claims := map[string]any{
		"iss": "https://accounts.google.com", "aud": verifierURL, "sub": "1234567890",
		"email": schedulerEmail, "email_verified": true,
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(),
	}
	if change != nil {
		change(claims)
	}
	token, err := signer.Sign(claims)
	require.NoError(t, err)
	return token
}

// TestVerifierChecksItsCaller: with the check on, the verifier runs only
// for a POST carrying the scheduler's Google OIDC token for its own URL;
// anything else is refused with a bare answer, the reason in the log only.
// (Google signs these tokens with RS256; the in-test keys are ES256, which
// the idtoken package validates the same way, through the same key fetch.)
func TestVerifierChecksItsCaller(t *testing.T) {
	t.Parallel()
	google, err := tokenissuer.New("https://accounts.google.com", "g1")
	require.NoError(t, err)
	forger, err := tokenissuer.New("https://accounts.google.com", "g1")
	require.NoError(t, err)
	var down atomic.Bool
	client, fetches := googleKeys(t, google, &down)
	h := newHarness(t, withCallerCheck(schedulerEmail, verifierURL, client))

	for _, tc := range []struct {
		name    string
		method  string
		token   string // "" sends no Authorization
		keysOff bool
		status  int
		body    string
		logged  string
	}{
		{name: "the scheduler", token: googleToken(t, google, nil), status: http.StatusOK},
		{name: "email in another case", token: googleToken(t, google, func(c map[string]any) { c["email"] = strings.ToUpper(schedulerEmail) }), status: http.StatusOK},
		{name: "no token", status: http.StatusUnauthorized, body: `{"error":"unauthorized"}`, logged: "no bearer token"},
		{name: "not a JWT", token: "abc", status: http.StatusUnauthorized, body: `{"error":"unauthorized"}`, logged: "no valid Google OIDC token"},
		{name: "another audience", token: googleToken(t, google, func(c map[string]any) { c["aud"] = "https://elsewhere.run.app" }),
			status: http.StatusUnauthorized, body: `{"error":"unauthorized"}`, logged: "audience"},
		{name: "expired", token: googleToken(t, google, func(c map[string]any) { c["exp"] = time.Now().Add(-time.Minute).Unix() }),
			status: http.StatusUnauthorized, body: `{"error":"unauthorized"}`, logged: "expired"},
		{name: "not Google's issuer", token: googleToken(t, google, func(c map[string]any) { c["iss"] = "https://evil.example" }),
			status: http.StatusUnauthorized, body: `{"error":"unauthorized"}`, logged: "is not Google's"},
		{name: "signed by another key", token: googleToken(t, forger, nil),
			status: http.StatusUnauthorized, body: `{"error":"unauthorized"}`, logged: "no valid Google OIDC token"},
		{name: "another account", token: googleToken(t, google, func(c map[string]any) { c["email"] = "someone@p1.iam.gserviceaccount.com" }),
			status: http.StatusForbidden, body: `{"error":"forbidden"}`, logged: "someone@p1.iam.gserviceaccount.com"},
		{name: "email not verified", token: googleToken(t, google, func(c map[string]any) { c["email_verified"] = false }),
			status: http.StatusForbidden, body: `{"error":"forbidden"}`, logged: "verified false"},
		{name: "no email", token: googleToken(t, google, func(c map[string]any) { delete(c, "email") }),
			status: http.StatusForbidden, body: `{"error":"forbidden"}`, logged: `email \"\"`},
		{name: "GET", method: http.MethodGet, token: googleToken(t, google, nil), status: http.StatusMethodNotAllowed, body: `{"error":"use POST"}`},
		{name: "Google's keys unavailable", token: googleToken(t, google, nil), keysOff: true,
			status: http.StatusServiceUnavailable, body: `{"error":"the caller could not be checked now"}`, logged: "could not be fetched"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			down.Store(tc.keysOff)
			defer down.Store(false)
			before := fetches.Load()
			req := httptest.NewRequest(cmp.Or(tc.method, http.MethodPost), "/Verify", strings.NewReader("{}"))
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			logsBefore := h.logs.Len()
			rec := httptest.NewRecorder()
			h.handler.ServeHTTP(rec, req)
			require.Equal(t, tc.status, rec.Code, rec.Body.String())
			if tc.body != "" {
				require.JSONEq(t, tc.body, rec.Body.String(), "a bare answer")
			}
			if tc.logged != "" {
				require.Contains(t, h.logs.String()[logsBefore:], tc.logged, "the reason is in the log")
			}
			if tc.status == http.StatusUnauthorized {
				require.Equal(t, "Bearer", rec.Header().Get("WWW-Authenticate"))
			}
			if tc.keysOff {
				require.Greater(t, fetches.Load(), before, "the keys were asked for")
			}
		})
	}
}

// TestVerifierCallerConfiguration: the check is on unless switched off by
// name, and then needs the scheduler's email and an https audience; a
// mistake is an error naming the variable, and Check("Verify") reports it
// while the drain's service, which does not read them, starts.
func TestVerifierCallerConfiguration(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string // "" for no error
	}{
		{"off", map[string]string{EnvVerifyCallerCheck: "off"}, ""},
		{"on", map[string]string{EnvVerifyCaller: schedulerEmail, EnvVerifyAudience: verifierURL}, ""},
		{"nothing set", map[string]string{}, EnvVerifyCaller},
		{"a switch other than off", map[string]string{EnvVerifyCallerCheck: "false"}, EnvVerifyCallerCheck},
		{"no email", map[string]string{EnvVerifyAudience: verifierURL}, EnvVerifyCaller},
		{"no audience", map[string]string{EnvVerifyCaller: schedulerEmail}, EnvVerifyAudience},
		{"plain HTTP audience", map[string]string{EnvVerifyCaller: schedulerEmail, EnvVerifyAudience: "http://replication-verify"}, EnvVerifyAudience},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := newCallerCheck(context.Background(), func(k string) string { return tc.env[k] }, nil)
			if tc.want == "" {
				require.NoError(t, err)
				require.Equal(t, tc.name == "on", c != nil)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}

	h := newHarness(t, withEnv(EnvVerifyCallerCheck, ""))
	code, body := h.verifyRaw("{}")
	require.Equal(t, http.StatusInternalServerError, code)
	require.JSONEq(t, `{"error":"the replication service is misconfigured"}`, body)
	require.Contains(t, h.logs.String(), EnvVerifyCaller)
	require.ErrorContains(t, h.srv.callerErr, EnvVerifyCaller, "kept for Check")
}

// TestVerifierRemembersThatGooglesKeysAreDown: while Google's keys cannot
// be fetched, a flood of well-formed forged tokens makes one fetch, not
// one each, and every refusal is a 503 logged with cause keys_unavailable.
func TestVerifierRemembersThatGooglesKeysAreDown(t *testing.T) {
	t.Parallel()
	google, err := tokenissuer.New("https://accounts.google.com", "g1")
	require.NoError(t, err)
	forger, err := tokenissuer.New("https://accounts.google.com", "g1")
	require.NoError(t, err)
	var down atomic.Bool
	down.Store(true)
	client, fetches := googleKeys(t, google, &down)
	h := newHarness(t, withCallerCheck(schedulerEmail, verifierURL, client))
	first := fetches.Load()
	forged := googleToken(t, forger, nil)
	const clients, calls = 20, 50
	refuse := func() {
		req := httptest.NewRequest(http.MethodPost, "/Verify", strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+forged)
		rec := httptest.NewRecorder()
		h.handler.ServeHTTP(rec, req)
		require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	}
	refuse() // the failed fetch the flood then meets
	started := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for range calls {
				refuse()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(started)
	require.LessOrEqual(t, fetches.Load()-first, int64(2), "one fetch (its retry at most), not one a token")
	// Each refusal has its line at DEBUG; at most one a second is a
	// WARNING, and the WARNINGs' refused counts add up to the refusals.
	warnings, counted := 0, 0
	for _, l := range h.lines(LogVerify) {
		require.Equal(t, "keys_unavailable", l["cause"])
		if l["severity"] == "WARNING" {
			warnings++
			counted += int(l["refused"].(float64))
		}
	}
	require.Len(t, h.lines(LogVerify), 1+clients*calls, "a line for each, most at DEBUG")
	require.LessOrEqual(t, warnings, 2+int(elapsed/time.Second), "at most one WARNING a second (%v)", elapsed)
	waiting := h.srv.refused.by["keys_unavailable/"+delivery.CauseKeysUnavailable].n
	require.Equal(t, 1+clients*calls, counted+waiting, "the WARNINGs count the refusals (and the next one those since the last)")
	require.NotContains(t, h.logs.String(), `"cause":"internal"`)

	// Google's keys are back: once the memory has lapsed (10 s), the next
	// call fetches them again and the scheduler's token is accepted.
	down.Store(false)
	deadline := time.Now().Add(time.Minute)
	for {
		req := httptest.NewRequest(http.MethodPost, "/Verify", strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+googleToken(t, google, nil))
		rec := httptest.NewRecorder()
		h.handler.ServeHTTP(rec, req)
		if rec.Code == http.StatusOK {
			break
		}
		require.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
		require.True(t, time.Now().Before(deadline), "the verifier still refuses a minute after Google's keys came back")
		time.Sleep(500 * time.Millisecond) // the memory's own lapse is what is waited for
	}
}
