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
	"sync"
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
	// KeyID is the first key's kid (Rotate replaces the key; CurrentKeyID
	// names the one in use).
	KeyID string
	mu    sync.RWMutex
	kid   string
	key   *ecdsa.PrivateKey
	// rotations counts the Rotates.
	rotations int
}

// New returns an issuer with a fresh key.
func New(url, keyID string) (*Issuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("identity: generate issuer key: %w", err)
	}
	return &Issuer{URL: url, KeyID: keyID, kid: keyID, key: key}, nil
}

// Rotate replaces the signing key with a fresh one named keyID: from now
// on the JWKS serves only the new key (the old one is removed, as an
// issuer does once its tokens have expired) and tokens are signed with it.
func (i *Issuer) Rotate(keyID string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("identity: generate issuer key: %w", err)
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	i.kid, i.key = keyID, key
	i.rotations++
	return nil
}

// Rotations is how many times Rotate replaced the key.
func (i *Issuer) Rotations() int {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return i.rotations
}

// CurrentKeyID is the kid of the key in use.
func (i *Issuer) CurrentKeyID() string {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return i.kid
}

// JWKS returns the public key set.
func (i *Issuer) JWKS() []byte {
	i.mu.RLock()
	defer i.mu.RUnlock()
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &i.key.PublicKey, KeyID: i.kid, Algorithm: string(jose.ES256), Use: "sig"}}}
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
	i.mu.RLock()
	kid, key := i.kid, i.key
	i.mu.RUnlock()
	opts := (&jose.SignerOptions{}).WithHeader(jose.HeaderKey("kid"), kid)
	if typ != "" {
		opts = opts.WithType(jose.ContentType(typ))
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, opts)
	if err != nil {
		return "", fmt.Errorf("identity: signer: %w", err)
	}
	token, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		return "", fmt.Errorf("identity: sign: %w", err)
	}
	return token, nil
}
