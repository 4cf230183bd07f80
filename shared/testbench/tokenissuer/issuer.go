// Package tokenissuer is a local runtime identity issuer for tests and the
// local mode: it signs the drain's wake-up tokens and serves its JWKS. It
// is never deployed.
package tokenissuer

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Issuer is a local runtime identity issuer: an ES256 key pair whose public
// half it serves as a JWKS. The local mode signs the drain's wake-up tokens
// with it, as the platform does in production; tests use it too.
type Issuer struct {
	// URL is the issuer (iss claim).
	URL string
	// KeyID is the key's kid.
	KeyID string
	key   *ecdsa.PrivateKey
}

// New returns an issuer with a fresh key.
func New(url, keyID string) (*Issuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("identity: generate issuer key: %w", err)
	}
	return &Issuer{URL: url, KeyID: keyID, key: key}, nil
}

// JWKS returns the public key set.
func (i *Issuer) JWKS() []byte {
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &i.key.PublicKey, KeyID: i.KeyID, Algorithm: string(jose.ES256), Use: "sig"}}}
	raw, _ := json.Marshal(set)
	return raw
}

// ServeHTTP serves the JWKS.
func (i *Issuer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(i.JWKS())
}

// Token signs a token for subject and audience, valid for ttl.
func (i *Issuer) Token(subject, audience string, ttl time.Duration) (string, error) {
	now := time.Now()
	return i.Sign(jwt.Claims{
		Issuer:   i.URL,
		Subject:  subject,
		Audience: jwt.Audience{audience},
		IssuedAt: jwt.NewNumericDate(now),
		Expiry:   jwt.NewNumericDate(now.Add(ttl)),
	})
}

// Sign signs arbitrary claims with the issuer's key, typ JWT.
func (i *Issuer) Sign(claims any) (string, error) {
	return i.SignTyped("JWT", claims)
}

// SignTyped signs arbitrary claims with the issuer's key and the typ
// header given (none when empty).
func (i *Issuer) SignTyped(typ string, claims any) (string, error) {
	opts := (&jose.SignerOptions{}).WithHeader(jose.HeaderKey("kid"), i.KeyID)
	if typ != "" {
		opts = opts.WithType(jose.ContentType(typ))
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: i.key}, opts)
	if err != nil {
		return "", fmt.Errorf("identity: signer: %w", err)
	}
	token, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		return "", fmt.Errorf("identity: sign: %w", err)
	}
	return token, nil
}
