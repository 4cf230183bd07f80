package identity_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/identity"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/testbench/tokenissuer"
)

func setup(t testing.TB) (*tokenissuer.Issuer, *identity.Verifier, *atomic.Int64) {
	t.Helper()
	iss, err := tokenissuer.New("https://issuer.test", "k1")
	require.NoError(t, err)
	var fetches atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		iss.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	v, err := identity.New(identity.Config{Identity: registry.Identity{Issuer: iss.URL, Audience: "replication", JWKSURL: srv.URL}})
	require.NoError(t, err)
	return iss, v, &fetches
}

func TestVerify(t *testing.T) {
	t.Parallel()
	iss, v, fetches := setup(t)
	ctx := context.Background()
	now := time.Now()
	good := jwt.Claims{Issuer: iss.URL, Subject: "runtime-w1", Audience: jwt.Audience{"replication"},
		Expiry: jwt.NewNumericDate(now.Add(time.Minute)), IssuedAt: jwt.NewNumericDate(now)}
	sign := func(c jwt.Claims) string {
		tok, err := iss.Sign(c)
		require.NoError(t, err)
		return tok
	}
	tok := sign(good)
	claims, err := v.Verify(ctx, tok)
	require.NoError(t, err)
	require.Equal(t, "runtime-w1", claims.Subject)

	other, err := tokenissuer.New(iss.URL, "k1")
	require.NoError(t, err)
	forged, err := other.Sign(good)
	require.NoError(t, err)
	unknownKid, err := tokenissuer.New(iss.URL, "k2")
	require.NoError(t, err)
	unknown, err := unknownKid.Sign(good)
	require.NoError(t, err)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	hs, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: []byte("0123456789abcdef0123456789abcdef")}, (&jose.SignerOptions{}).WithHeader("kid", "k1"))
	require.NoError(t, err)
	hmac, err := jwt.Signed(hs).Claims(good).Serialize()
	require.NoError(t, err)
	ps, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.PS256, Key: rsaKey}, (&jose.SignerOptions{}).WithHeader("kid", "k1"))
	require.NoError(t, err)
	wrongAlg, err := jwt.Signed(ps).Claims(good).Serialize()
	require.NoError(t, err)
	parts := strings.Split(tok, ".")
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","kid":"k1","typ":"JWT"}`)) + "." + parts[1] + "."

	with := func(f func(*jwt.Claims)) string { c := good; f(&c); return sign(c) }
	cases := []struct{ name, token string }{
		{"missing", ""},
		{"malformed", "not.a.jwt"},
		{"garbage", "abc"},
		{"expired", with(func(c *jwt.Claims) { c.Expiry = jwt.NewNumericDate(now.Add(-time.Hour)) })},
		{"no expiry", with(func(c *jwt.Claims) { c.Expiry = nil })},
		{"not yet valid", with(func(c *jwt.Claims) { c.NotBefore = jwt.NewNumericDate(now.Add(time.Hour)) })},
		{"wrong issuer", with(func(c *jwt.Claims) { c.Issuer = "https://evil.test" })},
		{"wrong audience", with(func(c *jwt.Claims) { c.Audience = jwt.Audience{"other"} })},
		{"no subject", with(func(c *jwt.Claims) { c.Subject = "" })},
		{"alg none", none},
		{"hmac", hmac},
		{"unaccepted algorithm", wrongAlg},
		{"forged signature", forged},
		{"unknown key id", unknown},
		{"tampered payload", parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"iss":"https://issuer.test","sub":"runtime-w2","aud":["replication"],"exp":9999999999}`)) + "." + parts[2]},
	}
	for _, c := range cases {
		_, err := v.Verify(ctx, c.token)
		require.ErrorIs(t, err, identity.ErrInvalidToken, c.name)
	}
	require.LessOrEqual(t, fetches.Load(), int64(2), "an unknown key id refetches the JWKS at most once per interval")
}

// TestTokenPolicy: the lifetime bound, the typ header when the registry
// sets a token type, and the organisation claim when it names one.
func TestTokenPolicy(t *testing.T) {
	t.Parallel()
	iss, err := tokenissuer.New("https://issuer.test", "k1")
	require.NoError(t, err)
	srv := httptest.NewServer(iss)
	t.Cleanup(srv.Close)
	verifier := func(id registry.Identity) *identity.Verifier {
		id.Issuer, id.Audience, id.JWKSURL = iss.URL, "replication", srv.URL
		v, err := identity.New(identity.Config{Identity: id})
		require.NoError(t, err)
		return v
	}
	plain := verifier(registry.Identity{})
	typed := verifier(registry.Identity{TokenType: "at+jwt"})
	withOrg := verifier(registry.Identity{OrganizationClaim: "org_id"})
	now := time.Now()
	claims := func(lifetime time.Duration, extra map[string]any) map[string]any {
		c := map[string]any{"iss": iss.URL, "sub": "runtime-w1", "aud": "replication", "iat": now.Unix(), "exp": now.Add(lifetime).Unix()}
		for k, v := range extra {
			c[k] = v
		}
		return c
	}
	sign := func(typ string, c map[string]any) string {
		tok, err := iss.SignTyped(typ, c)
		require.NoError(t, err)
		return tok
	}
	for _, tc := range []struct {
		name  string
		v     *identity.Verifier
		token string
		ok    bool
		org   string
	}{
		{"a day", plain, sign("JWT", claims(24*time.Hour, nil)), true, ""},
		{"longer than a day", plain, sign("JWT", claims(25*time.Hour, nil)), false, ""},
		{"a year without iat", plain, sign("JWT", func() map[string]any { c := claims(365*24*time.Hour, nil); delete(c, "iat"); return c }()), false, ""},
		{"iat long ago", plain, sign("JWT", func() map[string]any {
			c := claims(time.Hour, nil)
			c["iat"] = now.Add(-48 * time.Hour).Unix()
			return c
		}()), false, ""},
		{"any typ without a configured type", plain, sign("whatever", claims(time.Hour, nil)), true, ""},
		{"the configured type", typed, sign("at+jwt", claims(time.Hour, nil)), true, ""},
		{"the configured type, RFC 7515 form", typed, sign("application/AT+JWT", claims(time.Hour, nil)), true, ""},
		{"another type", typed, sign("JWT", claims(time.Hour, nil)), false, ""},
		{"no type", typed, sign("", claims(time.Hour, nil)), false, ""},
		{"the organisation claim", withOrg, sign("JWT", claims(time.Hour, map[string]any{"org_id": "org-1"})), true, "org-1"},
		{"no organisation claim", withOrg, sign("JWT", claims(time.Hour, nil)), false, ""},
		{"a number for the organisation", withOrg, sign("JWT", claims(time.Hour, map[string]any{"org_id": 7})), false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.v.Verify(context.Background(), tc.token)
			if !tc.ok {
				require.ErrorIs(t, err, identity.ErrInvalidToken)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.org, c.Organization)
		})
	}
}

func TestAuthorize(t *testing.T) {
	t.Parallel()
	ws := registry.Workspace{ID: "w1", OrganizationID: "org-1", RuntimeSubject: "runtime-w1"}
	require.NoError(t, identity.Authorize(identity.Claims{Subject: "runtime-w1"}, "org-1", ws))
	require.ErrorIs(t, identity.Authorize(identity.Claims{Subject: "runtime-w2"}, "org-1", ws), identity.ErrForbidden)
	require.ErrorIs(t, identity.Authorize(identity.Claims{Subject: "runtime-w1"}, "org-2", ws), identity.ErrForbidden)
	require.ErrorIs(t, identity.Authorize(identity.Claims{Subject: "runtime-w1"}, "", ws), identity.ErrForbidden)
	require.NoError(t, identity.Authorize(identity.Claims{Subject: "runtime-w1", Organization: "org-1"}, "org-1", ws))
	require.ErrorIs(t, identity.Authorize(identity.Claims{Subject: "runtime-w1", Organization: "org-2"}, "org-1", ws), identity.ErrForbidden,
		"the token's organisation claim must be the workspace's too")
}

func TestKeysUnavailable(t *testing.T) {
	t.Parallel()
	iss, err := tokenissuer.New("https://issuer.test", "k1")
	require.NoError(t, err)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "down", http.StatusBadGateway) }))
	defer srv.Close()
	v, err := identity.New(identity.Config{Identity: registry.Identity{Issuer: iss.URL, Audience: "a", JWKSURL: srv.URL}})
	require.NoError(t, err)
	tok, err := iss.Token("s", "a", time.Minute)
	require.NoError(t, err)
	_, err = v.Verify(context.Background(), tok)
	require.ErrorIs(t, err, identity.ErrKeysUnavailable)
	_, err = identity.New(identity.Config{Identity: registry.Identity{Issuer: "x", Audience: "a", JWKSURL: srv.URL, Algorithms: []string{"none"}}})
	require.ErrorContains(t, err, "Algorithms")
}

// FuzzVerify: Verify never panics on any token text, and accepts only
// what the issuer signed: a token it accepts carries the signed subject.
func FuzzVerify(f *testing.F) {
	iss, v, _ := setup(f)
	now := time.Now()
	good, err := iss.Sign(jwt.Claims{Issuer: iss.URL, Subject: "runtime-w1", Audience: jwt.Audience{"replication"},
		Expiry: jwt.NewNumericDate(now.Add(time.Hour)), IssuedAt: jwt.NewNumericDate(now)})
	require.NoError(f, err)
	f.Add(good)
	f.Add(good[:len(good)-2])
	f.Add(strings.Replace(good, ".", "..", 1))
	f.Add("")
	f.Add("a.b.c")
	f.Add("eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.")
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, token string) {
		claims, err := v.Verify(ctx, token)
		if err == nil && claims.Subject != "runtime-w1" {
			t.Fatalf("accepted a token the issuer never signed: %+v", claims)
		}
	})
}

// TestClockLeeway: the default leeway (30 s) is tolerated on expiry and
// not-before, just inside it, and no more, just outside it (10 s either
// side, a margin no busy machine takes between signing and checking).
func TestClockLeeway(t *testing.T) {
	t.Parallel()
	iss, v, _ := setup(t)
	now := time.Now()
	for _, c := range []struct {
		name string
		exp  time.Duration // from now
		nbf  time.Duration
		ok   bool
	}{
		{"expired 20 s ago", -20 * time.Second, 0, true},
		{"expired 40 s ago", -40 * time.Second, 0, false},
		{"valid from 20 s on", time.Minute, 20 * time.Second, true},
		{"valid from 40 s on", time.Minute, 40 * time.Second, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			claims := jwt.Claims{Issuer: iss.URL, Subject: "runtime-w1", Audience: jwt.Audience{"replication"},
				Expiry: jwt.NewNumericDate(now.Add(c.exp)), IssuedAt: jwt.NewNumericDate(now.Add(-time.Minute))}
			if c.nbf != 0 {
				claims.NotBefore = jwt.NewNumericDate(now.Add(c.nbf))
			}
			tok, err := iss.Sign(claims)
			require.NoError(t, err)
			_, err = v.Verify(context.Background(), tok)
			if c.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, identity.ErrInvalidToken)
			}
		})
	}
}
