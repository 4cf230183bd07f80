package identity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/segmentstream/ontology-replication/shared/logging"
)

// keyCache holds the issuer's signing keys for a fleet of drains: a request
// never waits on a fetch while usable keys exist, fetches never pile up
// (one at a time, shared by whoever waits for it), and a failing or
// hostile issuer costs a bounded number of fetches.
//
// It is written here rather than taken from a JWKS library because none of
// those that fit (go-oidc's remote key set, jwkset/keyfunc, jwx's cache)
// stops trusting keys after a maximum staleness — each keeps the last set
// forever while the issuer fails — and the last two would bring a second
// JOSE implementation beside go-jose, which verifies the tokens.
//
// The refresh is started by use, not by a timer: Cloud Run gives an
// instance's CPU to requests, so a timer between requests may not run, and
// a drain nobody calls needs no keys.
type keyCache struct {
	url    string
	client *http.Client
	log    *slog.Logger
	now    func() time.Time
	// refreshAfter: keys this old are refreshed in the background.
	refreshAfter time.Duration
	// maxStaleness: keys not refreshed for this long are not trusted.
	maxStaleness time.Duration
	// unknownKeyInterval: the least time between fetches caused by an
	// unknown key id.
	unknownKeyInterval time.Duration
	// fetchTimeout bounds one fetch (it runs on its own, not on a
	// request's context, since several requests may wait for it).
	fetchTimeout time.Duration

	mu          sync.Mutex
	keys        *jose.JSONWebKeySet
	fetchedAt   time.Time // the last successful fetch
	lastAttempt time.Time // the last fetch started
	// lastUnknown is when an unknown key id last started a fetch: the
	// fetches before it (the first, the background refreshes) do not
	// count against unknownKeyInterval, so that a rotation right after
	// one is taken at once.
	lastUnknown time.Time
	failures    int // consecutive failed fetches
	lastErr     error
	inflight    chan struct{}   // closed when the running fetch ends; nil when none runs
	fetches     int64           // fetches started (tests and logs)
	skipped     map[string]bool // keys fetch skipped and logged
}

// backoffLocked is how long after a failed fetch the next may start:
// 1 s doubling up to unknownKeyInterval.
func (c *keyCache) backoffLocked() time.Duration {
	if c.failures == 0 {
		return 0
	}
	return min(time.Second<<min(c.failures-1, 16), c.unknownKeyInterval)
}

// startLocked starts a fetch unless one runs, and returns the channel
// closed when the running fetch ends.
func (c *keyCache) startLocked() chan struct{} {
	if c.inflight != nil {
		return c.inflight
	}
	done := make(chan struct{})
	c.inflight = done
	c.lastAttempt = c.now()
	c.fetches++
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.fetchTimeout)
		defer cancel()
		keys, err := c.fetch(ctx)
		c.mu.Lock()
		if err != nil {
			c.failures++
			c.lastErr = err
			c.log.Warn("replication: runtime identity: the issuer's signing keys could not be fetched; verifying with the keys held",
				slog.String("jwks_url", c.url), slog.Int("consecutive_failures", c.failures), slog.String("error", err.Error()),
				slog.Duration("keys_age", c.ageLocked()))
		} else {
			c.keys, c.fetchedAt, c.failures, c.lastErr = keys, c.now(), 0, nil
		}
		c.inflight = nil
		c.mu.Unlock()
		close(done)
	}()
	return done
}

// ageLocked is how long ago the held keys were fetched (0 when none are
// held).
func (c *keyCache) ageLocked() time.Duration {
	if c.keys == nil {
		return 0
	}
	return c.now().Sub(c.fetchedAt)
}

// usableLocked reports whether keys are held and fresh enough to trust.
func (c *keyCache) usableLocked() bool {
	return c.keys != nil && c.ageLocked() <= c.maxStaleness
}

// findLocked returns the held signing key with the id and algorithm.
func (c *keyCache) findLocked(kid, alg string) (jose.JSONWebKey, bool) {
	for _, k := range c.keys.Key(kid) {
		if k.Algorithm != "" && k.Algorithm != alg {
			continue
		}
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		return k, true
	}
	return jose.JSONWebKey{}, false
}

// key returns the signing key with the id. With usable keys it never waits
// on a fetch, except for an unknown key id (a rotation), and then for at
// most one fetch per unknownKeyInterval, shared by every request waiting
// for it. Without usable keys it waits for a fetch, starting one unless the
// last failed less than its backoff ago.
func (c *keyCache) key(ctx context.Context, kid, alg string) (jose.JSONWebKey, error) {
	c.mu.Lock()
	if c.usableLocked() {
		if c.ageLocked() >= c.refreshAfter && c.now().Sub(c.lastAttempt) >= c.backoffLocked() {
			c.startLocked() // in the background: this request goes on with the held keys
		}
		if k, ok := c.findLocked(kid, alg); ok {
			c.mu.Unlock()
			return k, nil
		}
		var wait chan struct{}
		switch {
		case c.inflight != nil:
			wait = c.inflight
		case c.now().Sub(c.lastUnknown) >= c.unknownKeyInterval:
			c.lastUnknown = c.now()
			wait = c.startLocked()
		default:
			c.mu.Unlock()
			return jose.JSONWebKey{}, fmt.Errorf("%w: unknown key id %q (the keys were fetched for an unknown key id %v ago)", ErrInvalidToken, kid,
				c.now().Sub(c.lastUnknown).Round(time.Second))
		}
		c.mu.Unlock()
		if err := waitFor(ctx, wait); err != nil {
			return jose.JSONWebKey{}, err
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.usableLocked() {
			if k, ok := c.findLocked(kid, alg); ok {
				return k, nil
			}
		}
		return jose.JSONWebKey{}, fmt.Errorf("%w: unknown key id %q", ErrInvalidToken, kid)
	}
	var wait chan struct{}
	switch {
	case c.inflight != nil:
		wait = c.inflight
	case c.now().Sub(c.lastAttempt) >= c.backoffLocked():
		wait = c.startLocked()
	default:
		err := c.unavailableLocked()
		c.mu.Unlock()
		return jose.JSONWebKey{}, err
	}
	c.mu.Unlock()
	if err := waitFor(ctx, wait); err != nil {
		return jose.JSONWebKey{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.usableLocked() {
		return jose.JSONWebKey{}, c.unavailableLocked()
	}
	if k, ok := c.findLocked(kid, alg); ok {
		return k, nil
	}
	return jose.JSONWebKey{}, fmt.Errorf("%w: unknown key id %q", ErrInvalidToken, kid)
}

// unavailableLocked is the error for a request that found no usable keys.
func (c *keyCache) unavailableLocked() error {
	cause := c.lastErr
	if cause == nil {
		cause = errors.New("not fetched yet")
	}
	if c.keys != nil {
		return fmt.Errorf("%w: the keys held are %v old, more than the %v they may be trusted for, and the issuer fails: %w",
			ErrKeysUnavailable, c.ageLocked().Round(time.Second), c.maxStaleness, cause)
	}
	return fmt.Errorf("%w: %w", ErrKeysUnavailable, cause)
}

// waitFor waits for a fetch to end, or ctx.
func waitFor(ctx context.Context, done chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: waiting for the issuer's keys: %w", ErrKeysUnavailable, context.Cause(ctx))
	}
}

// maxJWKSBytes bounds a JWKS document: a larger one is refused.
const maxJWKSBytes = 1 << 20

// fetch reads the JWKS, at most maxJWKSBytes, decoding its keys one by one:
// a key the library cannot use (an unknown kty, an X25519 or other
// encryption key, a symmetric key, a private key, a key not for
// signatures) is skipped and logged once, and the set is refused only
// when no usable signing key remains. The day the issuer adds a key of a
// new type, the keys beside it keep working.
func (c *keyCache) fetch(ctx context.Context) (*jose.JSONWebKeySet, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", c.url, resp.Status)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.url, err)
	}
	if len(raw) > maxJWKSBytes {
		return nil, fmt.Errorf("%s: the key set is larger than %d bytes", c.url, maxJWKSBytes)
	}
	var doc struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", c.url, err)
	}
	var set jose.JSONWebKeySet
	var skipped []string
	for i, rawKey := range doc.Keys {
		var k jose.JSONWebKey
		var why string
		switch err := k.UnmarshalJSON(rawKey); {
		case err != nil:
			why = err.Error()
		case !k.Valid():
			why = "not a valid key"
		case !k.IsPublic():
			why = "not a public key (symmetric or private): never used to verify"
		case k.Use != "" && k.Use != "sig":
			why = fmt.Sprintf("use %q, not sig", k.Use)
		}
		if why != "" {
			skipped = append(skipped, why)
			c.logSkipped(i, rawKey, why)
			continue
		}
		set.Keys = append(set.Keys, k)
	}
	if len(set.Keys) == 0 {
		return nil, fmt.Errorf("%s holds no usable signing key (%d keys skipped: %s)", c.url, len(skipped), strings.Join(skipped, "; "))
	}
	return &set, nil
}

// logSkipped logs a key skipped by fetch, once per key (by its id, type
// and reason) for the cache's life: every refresh would skip it again.
func (c *keyCache) logSkipped(i int, rawKey json.RawMessage, why string) {
	var head struct {
		KeyID string `json:"kid"`
		Type  string `json:"kty"`
		Curve string `json:"crv"`
	}
	_ = json.Unmarshal(rawKey, &head)
	key := head.KeyID + "\x00" + head.Type + "\x00" + why
	c.mu.Lock()
	if c.skipped == nil {
		c.skipped = map[string]bool{}
	}
	seen := c.skipped[key] || len(c.skipped) >= 1000
	c.skipped[key] = true
	c.mu.Unlock()
	if !seen {
		c.log.Warn("replication: runtime identity: a key of the issuer's set cannot verify tokens and is skipped",
			slog.String("jwks_url", c.url), slog.Int("index", i), slog.String("kid", logging.Untrusted(head.KeyID)),
			slog.String("kty", logging.Untrusted(head.Type)), slog.String("crv", logging.Untrusted(head.Curve)), slog.String("reason", why))
	}
}

// keysClient is the key fetch's HTTP client: base's transport and timeout,
// and a redirect policy of its own. A redirect is followed only to the
// same scheme and host (at most 3), so that an https key URL can never be
// handed off to plain http or to another host.
func keysClient(base *http.Client) *http.Client {
	c := *base
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		first := via[0].URL
		switch {
		case len(via) > 3:
			return fmt.Errorf("%s: more than 3 redirects", first)
		case req.URL.Scheme != first.Scheme || req.URL.Host != first.Host:
			return fmt.Errorf("%s redirects to %s://%s: the keys are fetched from their own scheme and host only", first, req.URL.Scheme, req.URL.Host)
		}
		return nil
	}
	return &c
}
