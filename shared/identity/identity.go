package identity

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
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
	// URL, accepted algorithms, token type, organisation claim). Required.
	Identity registry.Identity
	// HTTPClient fetches the JWKS: its transport, with a redirect policy of
	// the verifier's own (same scheme and host only). Default:
	// http.DefaultClient's transport (each fetch is bounded by
	// FetchTimeout).
	HTTPClient *http.Client
	// KeysTTL is the age at which the keys are refreshed, in the
	// background: requests go on with the keys held meanwhile. Default: 10
	// minutes.
	KeysTTL time.Duration
	// MaxStaleness is the age past which keys that could not be refreshed
	// are no longer trusted (tokens are then refused as unverifiable until
	// the issuer answers). Default: 1 hour.
	MaxStaleness time.Duration
	// RefetchInterval is the least time between two fetches caused by an
	// unknown key id, and the longest backoff after failed fetches, so that
	// forged key ids or a failing issuer cannot make the verifier hammer
	// it. Default: 30 s.
	RefetchInterval time.Duration
	// FetchTimeout bounds one JWKS fetch. Default: 5 s.
	FetchTimeout time.Duration
	// Leeway is the clock skew tolerated on exp, nbf and iat. Default: 30 s.
	Leeway time.Duration
	// MaxLifetime bounds a token's lifetime (exp − iat, or exp − now
	// without iat): a stolen long-lived token is refused. Default: 24 hours.
	MaxLifetime time.Duration
	// Logger receives the key fetches' failures. Default: slog.Default().
	Logger *slog.Logger
	// Now returns the current time. Default: time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	c.HTTPClient = cmp.Or(c.HTTPClient, http.DefaultClient)
	c.KeysTTL = cmp.Or(c.KeysTTL, 10*time.Minute)
	c.MaxStaleness = cmp.Or(c.MaxStaleness, time.Hour)
	c.RefetchInterval = cmp.Or(c.RefetchInterval, 30*time.Second)
	c.FetchTimeout = cmp.Or(c.FetchTimeout, 5*time.Second)
	c.Leeway = cmp.Or(c.Leeway, 30*time.Second)
	c.MaxLifetime = cmp.Or(c.MaxLifetime, 24*time.Hour)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports the first invalid field (a zero field takes its
// default).
func (c Config) Validate() error {
	c = c.withDefaults()
	id := c.Identity
	switch {
	case id.Issuer == "" || id.Audience == "" || id.JWKSURL == "":
		return errors.New("Identity: issuer, audience and jwks_url are required for the drain")
	case c.KeysTTL < time.Second:
		return fmt.Errorf("KeysTTL %v: must be at least 1s", c.KeysTTL)
	case c.MaxStaleness < c.KeysTTL:
		return fmt.Errorf("MaxStaleness %v: must be at least KeysTTL (%v)", c.MaxStaleness, c.KeysTTL)
	case c.RefetchInterval < 0 || c.FetchTimeout < 0 || c.Leeway < 0 || c.MaxLifetime < 0:
		return errors.New("RefetchInterval, FetchTimeout, Leeway and MaxLifetime must not be negative")
	}
	for _, a := range id.Algorithms {
		switch jose.SignatureAlgorithm(a) {
		case jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512, jose.ES256, jose.ES384, jose.ES512, jose.EdDSA:
		default:
			return fmt.Errorf("Identity.Algorithms: %q is not an asymmetric signature algorithm", a)
		}
	}
	return nil
}

// Verifier checks runtime identity tokens: JWTs signed with one of the
// issuer's published keys, with the configured issuer and audience, not
// expired, not longer-lived than MaxLifetime, of the configured type, and
// carrying the organisation claim when one is configured. It is safe for
// concurrent use.
type Verifier struct {
	cfg        Config
	algorithms []jose.SignatureAlgorithm
	keys       *keyCache
}

// New returns a Verifier.
func New(cfg Config) (*Verifier, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("identity: invalid config: %w", err)
	}
	v := &Verifier{cfg: cfg, keys: &keyCache{
		url: cfg.Identity.JWKSURL, client: keysClient(cfg.HTTPClient), log: cfg.Logger, now: cfg.Now,
		refreshAfter: cfg.KeysTTL, maxStaleness: cfg.MaxStaleness, unknownKeyInterval: cfg.RefetchInterval, fetchTimeout: cfg.FetchTimeout,
	}}
	algs := cfg.Identity.Algorithms
	if len(algs) == 0 {
		algs = []string{"RS256", "ES256"}
	}
	for _, a := range algs {
		v.algorithms = append(v.algorithms, jose.SignatureAlgorithm(a))
	}
	return v, nil
}

// Claims are the verified claims of a runtime identity token.
type Claims struct {
	// Subject is the token's sub: the runtime's identity.
	Subject string
	// Organization is the organisation claim's value, when the registry
	// names one (identity.organization_claim).
	Organization string
	// Expiry is when the token expires.
	Expiry time.Time
}

// Verify checks a token and returns its claims. Every refusal wraps
// ErrInvalidToken; ErrKeysUnavailable when no trusted keys could be had.
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
	if want := v.cfg.Identity.TokenType; want != "" {
		typ, _ := header.ExtraHeaders[jose.HeaderType].(string)
		if !sameType(typ, want) {
			return Claims{}, fmt.Errorf("%w: typ %q, want %q", ErrInvalidToken, typ, want)
		}
	}
	key, err := v.keys.key(ctx, header.KeyID, header.Algorithm)
	if err != nil {
		return Claims{}, err
	}
	var claims jwt.Claims
	extra := map[string]any{}
	if err := tok.Claims(key.Key, &claims, &extra); err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrInvalidToken, err)
	}
	if claims.Expiry == nil {
		return Claims{}, fmt.Errorf("%w: no exp claim", ErrInvalidToken)
	}
	now := v.cfg.Now()
	err = claims.ValidateWithLeeway(jwt.Expected{
		Issuer:      v.cfg.Identity.Issuer,
		AnyAudience: jwt.Audience{v.cfg.Identity.Audience},
		Time:        now,
	}, v.cfg.Leeway)
	if err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrInvalidToken, err)
	}
	issued := now
	if claims.IssuedAt != nil {
		issued = claims.IssuedAt.Time()
	}
	if lifetime := claims.Expiry.Time().Sub(issued); lifetime > v.cfg.MaxLifetime+v.cfg.Leeway {
		return Claims{}, fmt.Errorf("%w: lifetime %v, more than the %v accepted", ErrInvalidToken, lifetime.Round(time.Second), v.cfg.MaxLifetime)
	}
	if claims.Subject == "" {
		return Claims{}, fmt.Errorf("%w: no sub claim", ErrInvalidToken)
	}
	out := Claims{Subject: claims.Subject, Expiry: claims.Expiry.Time()}
	if name := v.cfg.Identity.OrganizationClaim; name != "" {
		org, _ := extra[name].(string)
		if org == "" {
			return Claims{}, fmt.Errorf("%w: no %s claim", ErrInvalidToken, name)
		}
		out.Organization = org
	}
	return out, nil
}

// sameType compares typ header values as RFC 7515 says: case-insensitively,
// with or without the "application/" prefix.
func sameType(got, want string) bool {
	trim := func(s string) string { return strings.TrimPrefix(strings.ToLower(s), "application/") }
	return trim(got) == trim(want)
}

// ErrForbidden means a valid token does not belong to the workspace, or the
// organisation header does not match it.
var ErrForbidden = errors.New("the runtime identity does not belong to this workspace")

// Authorize checks that verified claims and the organisation header belong
// to the workspace: sub is its runtime_subject, the header its
// organization_id and, when the registry names an organisation claim, the
// claim too. Without the claim the header is the caller's word only: the
// subject is what binds a token to its workspace.
func Authorize(c Claims, organizationHeader string, ws registry.Workspace) error {
	if c.Subject != ws.RuntimeSubject {
		return fmt.Errorf("%w: subject %q is not workspace %s's runtime", ErrForbidden, c.Subject, ws.ID)
	}
	if organizationHeader != ws.OrganizationID {
		return fmt.Errorf("%w: organization %q is not workspace %s's", ErrForbidden, organizationHeader, ws.ID)
	}
	if c.Organization != "" && c.Organization != ws.OrganizationID {
		return fmt.Errorf("%w: the token's organization %q is not workspace %s's", ErrForbidden, c.Organization, ws.ID)
	}
	return nil
}
