package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/registry"
)

// clock is a test's time, moved by hand.
type clock struct{ t atomic.Pointer[time.Time] }

func newClock() *clock {
	c := &clock{}
	now := time.Now()
	c.t.Store(&now)
	return c
}

func (c *clock) now() time.Time { return *c.t.Load() }

func (c *clock) advance(d time.Duration) {
	t := c.now().Add(d)
	c.t.Store(&t)
}

// issuer is a JWKS endpoint whose keys and health a test controls.
type issuer struct {
	t     testing.TB
	mu    sync.Mutex
	keys  map[string]*ecdsa.PrivateKey
	serve []string // the key ids the JWKS lists
	// fail answers 503 while set; hold, while set, holds each request until
	// it is closed.
	fail bool
	hold chan struct{}
	hits atomic.Int64
	// arrived receives a value as each request arrives.
	arrived chan struct{}
	srv     *httptest.Server
}

func newIssuer(t testing.TB, kids ...string) *issuer {
	i := &issuer{t: t, keys: map[string]*ecdsa.PrivateKey{}, arrived: make(chan struct{}, 1000)}
	for _, kid := range kids {
		i.addKey(kid)
	}
	i.srv = httptest.NewServer(http.HandlerFunc(i.handle))
	t.Cleanup(i.srv.Close)
	return i
}

func (i *issuer) addKey(kid string) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(i.t, err)
	i.mu.Lock()
	defer i.mu.Unlock()
	i.keys[kid] = k
	i.serve = append(i.serve, kid)
}

// publish sets the key ids the JWKS lists.
func (i *issuer) publish(kids ...string) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.serve = kids
}

func (i *issuer) set(fail bool, hold chan struct{}) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.fail, i.hold = fail, hold
}

func (i *issuer) handle(w http.ResponseWriter, r *http.Request) {
	i.hits.Add(1)
	i.arrived <- struct{}{}
	i.mu.Lock()
	fail, hold := i.fail, i.hold
	var set jose.JSONWebKeySet
	for _, kid := range i.serve {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: &i.keys[kid].PublicKey, KeyID: kid, Algorithm: string(jose.ES256), Use: "sig"})
	}
	i.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	if fail {
		http.Error(w, "issuer down", http.StatusServiceUnavailable)
		return
	}
	_ = json.NewEncoder(w).Encode(set)
}

// token signs a valid token with key kid (a key the issuer never had
// signs with a fresh one).
func (i *issuer) token(kid string, now time.Time) string {
	i.mu.Lock()
	k := i.keys[kid]
	i.mu.Unlock()
	if k == nil {
		var err error
		k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(i.t, err)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: k}, (&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), kid))
	require.NoError(i.t, err)
	tok, err := jwt.Signed(signer).Claims(jwt.Claims{Issuer: "https://issuer.test", Subject: "runtime-w1", Audience: jwt.Audience{"replication"},
		IssuedAt: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(time.Hour))}).Serialize()
	require.NoError(i.t, err)
	return tok
}

func newTestVerifier(t testing.TB, iss *issuer, clk *clock) *Verifier {
	v, err := New(Config{Identity: registry.Identity{Issuer: "https://issuer.test", Audience: "replication", JWKSURL: iss.srv.URL}, Now: clk.now, FetchTimeout: time.Minute})
	require.NoError(t, err)
	return v
}

// verifying returns an issuer of k1 and a verifier on a test clock that
// has fetched its keys once and verified a k1 token with them.
func verifying(t *testing.T) (*clock, *issuer, *Verifier) {
	t.Helper()
	clk := newClock()
	iss := newIssuer(t, "k1")
	v := newTestVerifier(t, iss, clk)
	_, err := v.Verify(context.Background(), iss.token("k1", clk.now()))
	require.NoError(t, err)
	return clk, iss, v
}

// idle waits for the fetch in flight, if any, to end.
func (v *Verifier) idle() {
	v.keys.mu.Lock()
	ch := v.keys.inflight
	v.keys.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// within fails the test unless f returns before the guard (a generous
// bound for "did not wait for the issuer": the issuer is held meanwhile, so
// anything that waited for it could not return at all).
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still waiting (on the held issuer)", what)
	}
}
