package identity

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/registry"
)

func TestKeysSlowIssuer(t *testing.T) {
	t.Parallel()
	clk, iss, v := verifying(t)
	ctx := context.Background()
	require.EqualValues(t, 1, iss.hits.Load())
	<-iss.arrived

	// Past the TTL, with the issuer holding every request: four concurrent
	// valid tokens are verified with the keys held, and one refresh runs.
	clk.advance(11 * time.Minute)
	hold := make(chan struct{})
	iss.set(false, hold)
	within(t, "valid tokens while the issuer is slow", func() {
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				_, err := v.Verify(ctx, iss.token("k1", clk.now()))
				assert.NoError(t, err)
			})
		}
		wg.Wait()
	})
	<-iss.arrived // the background refresh reached the issuer
	require.EqualValues(t, 2, iss.hits.Load(), "one background refresh for four requests")
	close(hold)
	v.idle()
	v.keys.mu.Lock()
	age := v.keys.ageLocked()
	v.keys.mu.Unlock()
	require.Zero(t, age, "the refresh replaced the keys")
}

func TestKeysFailingIssuer(t *testing.T) {
	t.Parallel()
	clk, iss, v := verifying(t)
	ctx := context.Background()
	iss.set(true, nil)

	// Ten minutes of an issuer that fails, a request a second: every
	// valid token is verified, and the refreshes back off (1 s doubling to
	// 30 s) instead of one per request.
	clk.advance(10 * time.Minute)
	for range 600 {
		clk.advance(time.Second)
		_, err := v.Verify(ctx, iss.token("k1", clk.now()))
		require.NoError(t, err)
		v.idle()
	}
	hits := iss.hits.Load() - 1
	t.Logf("%d refresh attempts in 10 minutes", hits)
	require.GreaterOrEqual(t, hits, int64(10), "it keeps trying")
	require.LessOrEqual(t, hits, int64(6+600/30+1), "backed off: 1, 2, 4, 8, 16 s, then every 30 s")
}

func TestKeysMaximumStaleness(t *testing.T) {
	t.Parallel()
	clk, iss, v := verifying(t)
	ctx := context.Background()
	iss.set(true, nil)

	clk.advance(59 * time.Minute)
	_, err := v.Verify(ctx, iss.token("k1", clk.now()))
	require.NoError(t, err, "keys 59 minutes old are still trusted")
	v.idle()

	clk.advance(2 * time.Minute)
	_, err = v.Verify(ctx, iss.token("k1", clk.now()))
	require.ErrorIs(t, err, ErrKeysUnavailable, "keys an hour old that could not be refreshed are not trusted")
	require.ErrorContains(t, err, "503")
	hits := iss.hits.Load()
	_, err = v.Verify(ctx, iss.token("k1", clk.now()))
	require.ErrorIs(t, err, ErrKeysUnavailable)
	require.Equal(t, hits, iss.hits.Load(), "within the backoff, no fetch: the refusal is immediate")

	iss.set(false, nil)
	clk.advance(31 * time.Second)
	_, err = v.Verify(ctx, iss.token("k1", clk.now()))
	require.NoError(t, err, "the issuer is back: its keys are fetched and trusted again")
}

func TestKeysRotation(t *testing.T) {
	t.Parallel()
	clk, iss, v := verifying(t)
	ctx := context.Background()

	// The issuer adds k2 and signs with it: the first k2 token refetches.
	iss.addKey("k2")
	_, err := v.Verify(ctx, iss.token("k2", clk.now()))
	require.NoError(t, err)
	require.EqualValues(t, 2, iss.hits.Load())
	_, err = v.Verify(ctx, iss.token("k1", clk.now()))
	require.NoError(t, err, "k1 is still published")

	// The issuer drops k1: once the keys are refreshed, k1 is refused.
	iss.publish("k2")
	clk.advance(11 * time.Minute)
	_, err = v.Verify(ctx, iss.token("k2", clk.now()))
	require.NoError(t, err)
	v.idle()
	require.EqualValues(t, 3, iss.hits.Load(), "refreshed past the TTL")
	_, err = v.Verify(ctx, iss.token("k1", clk.now()))
	require.ErrorIs(t, err, ErrInvalidToken, "a key the issuer withdrew is not trusted")
}

// TestKeysRotationRightAfterAFetch: an issuer that replaces its key
// (the new one served, the old removed) right after the keys were fetched
// is followed at once, not an interval later; another unknown key id
// within the interval is refused without a fetch, and one after it
// fetches again.
func TestKeysRotationRightAfterAFetch(t *testing.T) {
	t.Parallel()
	clk, iss, v := verifying(t)
	ctx := context.Background()
	_, err := v.Verify(ctx, iss.token("k1", clk.now()))
	require.NoError(t, err)
	fetched := iss.hits.Load()

	iss.addKey("k2")
	iss.publish("k2")
	_, err = v.Verify(ctx, iss.token("k2", clk.now()))
	require.NoError(t, err, "the rotated key is fetched at once")
	require.Equal(t, fetched+1, iss.hits.Load())

	_, err = v.Verify(ctx, iss.token("forged", clk.now()))
	require.ErrorIs(t, err, ErrInvalidToken)
	require.Equal(t, fetched+1, iss.hits.Load(), "a second unknown key id within the interval fetches nothing")
	clk.advance(31 * time.Second)
	_, err = v.Verify(ctx, iss.token("forged-2", clk.now()))
	require.ErrorIs(t, err, ErrInvalidToken)
	require.Equal(t, fetched+2, iss.hits.Load(), "after the interval it fetches again")
}

func TestKeysForgedKeyIDsWhileFailing(t *testing.T) {
	t.Parallel()
	clk, iss, v := verifying(t)
	ctx := context.Background()
	<-iss.arrived

	// The issuer hangs, then fails. Fifty tokens with forged key ids cause
	// one fetch, shared; valid tokens meanwhile do not wait for it.
	clk.advance(31 * time.Second)
	hold := make(chan struct{})
	iss.set(true, hold)
	var forged sync.WaitGroup
	refused := atomic.Int64{}
	for n := range 50 {
		forged.Go(func() {
			_, err := v.Verify(ctx, iss.token(fmt.Sprintf("forged-%d", n), clk.now()))
			if err != nil {
				refused.Add(1)
			}
		})
	}
	<-iss.arrived // the forged ids' fetch is at the issuer, held
	within(t, "valid tokens while forged key ids wait for the issuer", func() {
		for range 20 {
			_, err := v.Verify(ctx, iss.token("k1", clk.now()))
			assert.NoError(t, err)
		}
	})
	close(hold)
	forged.Wait()
	require.EqualValues(t, 50, refused.Load())
	require.EqualValues(t, 2, iss.hits.Load(), "one fetch for fifty forged key ids")

	// Within the interval, more forged ids fetch nothing.
	clk.advance(10 * time.Second)
	for n := range 50 {
		_, err := v.Verify(ctx, iss.token(fmt.Sprintf("again-%d", n), clk.now()))
		require.ErrorIs(t, err, ErrInvalidToken)
	}
	require.EqualValues(t, 2, iss.hits.Load(), "forged key ids within 30 s of a fetch cause none")
}

// BenchmarkVerify: token verification healthy, and with the issuer down
// (failing, or hanging until the fetch times out) through ten minutes of
// traffic past the keys' TTL. p50 and p99 are reported in µs.
func BenchmarkVerify(b *testing.B) {
	for _, mode := range []string{"healthy", "issuer-failing", "issuer-hanging"} {
		b.Run(mode, func(b *testing.B) {
			clk := newClock()
			iss := newIssuer(b, "k1")
			go func() {
				for range iss.arrived {
				}
			}()
			v := newTestVerifier(b, iss, clk)
			ctx := context.Background()
			tok := iss.token("k1", clk.now())
			_, err := v.Verify(ctx, tok)
			require.NoError(b, err)
			start := clk.now()
			switch mode {
			case "issuer-failing":
				iss.set(true, nil)
			case "issuer-hanging":
				hold := make(chan struct{})
				b.Cleanup(func() { close(hold) })
				iss.set(true, hold)
			}
			var took []time.Duration
			i := 0
			for b.Loop() {
				if mode != "healthy" {
					// Past the TTL, through ten minutes of outage.
					t := start.Add(10*time.Minute + time.Duration(i%600)*time.Second)
					clk.t.Store(&t)
				}
				i++
				began := time.Now()
				if _, err := v.Verify(ctx, tok); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(began))
			}
			sort.Slice(took, func(a, c int) bool { return took[a] < took[c] })
			b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(iss.hits.Load()-1), "fetches")
		})
	}
}

// rawIssuer serves a JWKS document a test writes by hand.
func rawIssuer(t *testing.T, doc func() string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(doc()))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestKeysMixedKeyTypes: a key set holding the valid ES256 key beside keys
// the library cannot use to verify — an X25519 (OKP) key, an unknown kty,
// a symmetric (oct) key, a private key, an encryption key — verifies a
// valid token: the others are skipped, each logged once however many times
// the set is fetched. A set with no usable key is refused, saying why.
func TestKeysMixedKeyTypes(t *testing.T) {
	t.Parallel()
	iss := newIssuer(t, "k1")
	good, err := json.Marshal(jose.JSONWebKey{Key: &iss.keys["k1"].PublicKey, KeyID: "k1", Algorithm: string(jose.ES256), Use: "sig"})
	require.NoError(t, err)
	private, err := json.Marshal(jose.JSONWebKey{Key: iss.keys["k1"], KeyID: "k-private", Algorithm: string(jose.ES256)})
	require.NoError(t, err)
	enc, err := json.Marshal(jose.JSONWebKey{Key: &iss.keys["k1"].PublicKey, KeyID: "k-enc", Algorithm: string(jose.ECDH_ES), Use: "enc"})
	require.NoError(t, err)
	others := []string{
		`{"kty":"OKP","crv":"X25519","kid":"k-x25519","x":"hSDwCYkwp1R0i33ctD73Wg2_Og0mOBr066SpjqqbTmo"}`,
		`{"kty":"FOO","kid":"k-foo","x":"abc"}`,
		`{"kty":"oct","kid":"k-oct","k":"GawgguFyGrWKav7AX4VKUg"}`,
		string(private), string(enc),
	}
	var mu sync.Mutex
	keys := append([]string{string(good)}, others...)
	srv := rawIssuer(t, func() string {
		mu.Lock()
		defer mu.Unlock()
		return `{"keys":[` + strings.Join(keys, ",") + `]}`
	})
	var logs strings.Builder
	var logMu sync.Mutex
	log := slog.New(slog.NewJSONHandler(writerFunc(func(p []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.Write(p)
	}), nil))
	clk := newClock()
	v, err := New(Config{Identity: registry.Identity{Issuer: "https://issuer.test", Audience: "replication", JWKSURL: srv.URL}, Now: clk.now,
		FetchTimeout: time.Minute, Logger: log})
	require.NoError(t, err)
	_, err = v.Verify(context.Background(), iss.token("k1", clk.now()))
	require.NoError(t, err, "the valid key verifies, whatever else the set holds")
	clk.advance(11 * time.Minute) // past KeysTTL: a background refresh
	_, err = v.Verify(context.Background(), iss.token("k1", clk.now()))
	require.NoError(t, err)
	v.idle()
	logMu.Lock()
	text := logs.String()
	logMu.Unlock()
	require.EqualValues(t, 2, v.keys.fetches, "fetched twice")
	for _, kid := range []string{"k-x25519", "k-foo", "k-oct", "k-private", "k-enc"} {
		require.Equal(t, 1, strings.Count(text, `\"`+kid+`\"`), "%s skipped and logged once: %s", kid, text)
	}
	require.NotContains(t, text, `\"k1\"`)

	// No usable key left: refused, with the reasons.
	mu.Lock()
	keys = others
	mu.Unlock()
	clk2 := newClock()
	v2, err := New(Config{Identity: registry.Identity{Issuer: "https://issuer.test", Audience: "replication", JWKSURL: srv.URL}, Now: clk2.now,
		FetchTimeout: time.Minute, Logger: log})
	require.NoError(t, err)
	_, err = v2.Verify(context.Background(), iss.token("k1", clk2.now()))
	require.ErrorIs(t, err, ErrKeysUnavailable)
	require.ErrorContains(t, err, "no usable signing key (5 keys skipped")
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestKeysRedirects: the key fetch follows a redirect to its own scheme
// and host, and refuses one to plain http or to another host (the keys
// would come from someone else), and a set over 1 MB.
func TestKeysRedirects(t *testing.T) {
	t.Parallel()
	iss := newIssuer(t, "k1")
	other := httptest.NewTLSServer(iss.srv.Config.Handler) // another host, https
	t.Cleanup(other.Close)
	var target atomic.Value
	keys := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/moved":
			http.Redirect(w, r, "/jwks", http.StatusFound)
		case "/jwks":
			iss.srv.Config.Handler.ServeHTTP(w, r)
		case "/huge":
			_, _ = w.Write([]byte(`{"keys":[],"pad":"` + strings.Repeat("x", 1<<20) + `"}`))
		default:
			http.Redirect(w, r, target.Load().(string), http.StatusFound)
		}
	}))
	t.Cleanup(keys.Close)
	// Both TLS test servers share the test CA: trust it for both.
	client := keys.Client()
	for _, c := range []struct {
		name, path, to string
		ok             bool
		err            string
	}{
		{"same host", "/moved", "", true, ""},
		{"to plain http", "/away", iss.srv.URL + "/", false, "redirects to http://"},
		{"to another host", "/away", other.URL + "/", false, "the keys are fetched from their own scheme and host only"},
		{"over 1 MB", "/huge", "", false, "larger than"},
	} {
		t.Run(c.name, func(t *testing.T) {
			target.Store(c.to)
			clk := newClock()
			v, err := New(Config{Identity: registry.Identity{Issuer: "https://issuer.test", Audience: "replication", JWKSURL: keys.URL + c.path},
				Now: clk.now, FetchTimeout: time.Minute, HTTPClient: client})
			require.NoError(t, err)
			_, err = v.Verify(context.Background(), iss.token("k1", clk.now()))
			if c.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrKeysUnavailable)
			require.ErrorContains(t, err, c.err)
		})
	}
}

// TestKeysWithoutUseOrAlg: RFC 7517 makes a key's `use` and `alg` optional,
// and issuers omit them; such a key verifies (its algorithm is the
// token's, within the allowed ones).
func TestKeysWithoutUseOrAlg(t *testing.T) {
	t.Parallel()
	iss := newIssuer(t, "k1")
	bare, err := json.Marshal(jose.JSONWebKey{Key: &iss.keys["k1"].PublicKey, KeyID: "k1"})
	require.NoError(t, err)
	require.NotContains(t, string(bare), `"use"`)
	require.NotContains(t, string(bare), `"alg"`)
	srv := rawIssuer(t, func() string { return `{"keys":[` + string(bare) + `]}` })
	clk := newClock()
	v, err := New(Config{Identity: registry.Identity{Issuer: "https://issuer.test", Audience: "replication", JWKSURL: srv.URL}, Now: clk.now,
		FetchTimeout: time.Minute, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	_, err = v.Verify(context.Background(), iss.token("k1", clk.now()))
	require.NoError(t, err)
}
