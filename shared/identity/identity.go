package identity

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/segmentstream/ontology-replication/shared/registry"
)

// ErrInvalidToken is returned for every token the verifier refuses. The
// wrapped detail is for logs, never for the caller.
var ErrInvalidToken = errors.New("invalid runtime identity token")

// ErrKeysUnavailable means the issuer's signing keys could not be fetched:
// the token could not be checked, which a later attempt may fix.
var ErrKeysUnavailable = errors.New("runtime identity signing keys are unavailable")

// Config configures a Verifier.
type Config struct {
	// Identity is the registry's identity section (issuer, audience, JWKS
	// URL, accepted algorithms). Required.
	Identity registry.Identity
	// HTTPClient fetches the JWKS. Default: a client with a 5 s timeout.
	HTTPClient *http.Client
	// KeysTTL is how long fetched keys are trusted before a refetch.
	// Default: 10 minutes.
	KeysTTL time.Duration
	// RefetchInterval is the least time between two fetches caused by an
	// unknown key id, so forged key ids cannot make the verifier hammer the
	// issuer. Default: 30 s.
	RefetchInterval time.Duration
	// Leeway is the clock skew tolerated on exp, nbf and iat. Default: 30 s.
	Leeway time.Duration
	// Now returns the current time. Default: time.Now.
	Now func() time.Time
}

// Verifier checks runtime identity tokens: JWTs signed with one of the
// issuer's published keys, with the configured issuer and audience, not
// expired.
type Verifier struct {
	cfg        Config
	algorithms []jose.SignatureAlgorithm

	mu        sync.Mutex
	keys      *jose.JSONWebKeySet
	fetchedAt time.Time
}

// New returns a Verifier.
func New(cfg Config) (*Verifier, error) {
	cfg.HTTPClient = cmp.Or(cfg.HTTPClient, &http.Client{Timeout: 5 * time.Second})
	cfg.KeysTTL = cmp.Or(cfg.KeysTTL, 10*time.Minute)
	cfg.RefetchInterval = cmp.Or(cfg.RefetchInterval, 30*time.Second)
	cfg.Leeway = cmp.Or(cfg.Leeway, 30*time.Second)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	id := cfg.Identity
	if id.Issuer == "" || id.Audience == "" || id.JWKSURL == "" {
		return nil, errors.New("identity: invalid config: Identity: issuer, audience and jwks_url are required for the drain")
	}
	v := &Verifier{cfg: cfg}
	algs := id.Algorithms
	if len(algs) == 0 {
		algs = []string{"RS256", "ES256"}
	}
	for _, a := range algs {
		switch alg := jose.SignatureAlgorithm(a); alg {
		case jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512, jose.ES256, jose.ES384, jose.ES512, jose.EdDSA:
			v.algorithms = append(v.algorithms, alg)
		default:
			return nil, fmt.Errorf("identity: invalid config: Identity.Algorithms: %q is not an asymmetric signature algorithm", a)
		}
	}
	return v, nil
}

// Claims are the verified claims of a runtime identity token.
type Claims struct {
	// Subject is the token's sub: the runtime's identity.
	Subject string
	// Expiry is when the token expires.
	Expiry time.Time
}

// Verify checks a token and returns its claims. Every refusal wraps
// ErrInvalidToken; ErrKeysUnavailable when the keys could not be fetched.
func (v *Verifier) Verify(ctx context.Context, token string) (Claims, error) {
	if token == "" {
		return Claims{}, fmt.Errorf("%w: missing", ErrInvalidToken)
	}
	tok, err := jwt.ParseSigned(token, v.algorithms)
	if err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrInvalidToken, err)
	}
	if len(tok.Headers) != 1 {
		return Claims{}, fmt.Errorf("%w: want one signature", ErrInvalidToken)
	}
	header := tok.Headers[0]
	key, err := v.key(ctx, header.KeyID, header.Algorithm)
	if err != nil {
		return Claims{}, err
	}
	var claims jwt.Claims
	if err := tok.Claims(key.Key, &claims); err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrInvalidToken, err)
	}
	if claims.Expiry == nil {
		return Claims{}, fmt.Errorf("%w: no exp claim", ErrInvalidToken)
	}
	err = claims.ValidateWithLeeway(jwt.Expected{
		Issuer:      v.cfg.Identity.Issuer,
		AnyAudience: jwt.Audience{v.cfg.Identity.Audience},
		Time:        v.cfg.Now(),
	}, v.cfg.Leeway)
	if err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrInvalidToken, err)
	}
	if claims.Subject == "" {
		return Claims{}, fmt.Errorf("%w: no sub claim", ErrInvalidToken)
	}
	return Claims{Subject: claims.Subject, Expiry: claims.Expiry.Time()}, nil
}

// key returns the signing key with the id, fetching the JWKS when it is
// stale or (at most every RefetchInterval) when the id is unknown.
func (v *Verifier) key(ctx context.Context, kid, alg string) (jose.JSONWebKey, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.cfg.Now()
	stale := v.keys == nil || now.Sub(v.fetchedAt) > v.cfg.KeysTTL
	for attempt := 0; attempt < 2; attempt++ {
		if stale {
			keys, err := v.fetch(ctx)
			if err != nil {
				if v.keys == nil {
					return jose.JSONWebKey{}, err
				}
				// Keep verifying with the keys we have while the issuer is unreachable.
			} else {
				v.keys, v.fetchedAt = keys, now
			}
		}
		for _, k := range v.keys.Key(kid) {
			if k.Algorithm != "" && k.Algorithm != alg {
				continue
			}
			if k.Use != "" && k.Use != "sig" {
				continue
			}
			return k, nil
		}
		if stale || now.Sub(v.fetchedAt) < v.cfg.RefetchInterval {
			break
		}
		stale = true
	}
	return jose.JSONWebKey{}, fmt.Errorf("%w: unknown key id %q", ErrInvalidToken, kid)
}

func (v *Verifier) fetch(ctx context.Context) (*jose.JSONWebKeySet, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.cfg.Identity.JWKSURL, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKeysUnavailable, err)
	}
	resp, err := v.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKeysUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: %s answered %s", ErrKeysUnavailable, v.cfg.Identity.JWKSURL, resp.Status)
	}
	var set jose.JSONWebKeySet
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&set); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrKeysUnavailable, v.cfg.Identity.JWKSURL, err)
	}
	for i, k := range set.Keys {
		if !k.IsPublic() {
			return nil, fmt.Errorf("%w: key %d (%q) of %s is not a public key", ErrKeysUnavailable, i, k.KeyID, v.cfg.Identity.JWKSURL)
		}
	}
	return &set, nil
}

// ErrForbidden means a valid token does not belong to the workspace, or the
// organisation header does not match it.
var ErrForbidden = errors.New("the runtime identity does not belong to this workspace")

// Authorize checks that verified claims and the organisation header belong
// to the workspace: sub is its runtime_subject and the header its
// organization_id.
func Authorize(c Claims, organizationHeader string, ws registry.Workspace) error {
	if c.Subject != ws.RuntimeSubject {
		return fmt.Errorf("%w: subject %q is not workspace %s's runtime", ErrForbidden, c.Subject, ws.ID)
	}
	if organizationHeader != ws.OrganizationID {
		return fmt.Errorf("%w: organization %q is not workspace %s's", ErrForbidden, organizationHeader, ws.ID)
	}
	return nil
}
