package functions

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/api/idtoken"
	"google.golang.org/api/option"
)

// The verifier's caller check. Cloud Run's IAM already lets only the
// scheduler's account invoke the private verifier; the check in code holds
// if that binding is widened by mistake (an allUsers invoker, a broader
// role), and says in the log why a call was refused.
const (
	// EnvVerifyCaller is the one service account (email) whose Google
	// OIDC token the verifier accepts: the scheduler's.
	EnvVerifyCaller = "VERIFY_CALLER"
	// EnvVerifyAudience is the audience the token must name: the verifier
	// service's URL.
	EnvVerifyAudience = "VERIFY_AUDIENCE"
	// EnvVerifyCallerCheck set to "off" turns the check off: for the local
	// mode and tests, which have no Google-signed tokens. Anything else but
	// empty is a configuration error.
	EnvVerifyCallerCheck = "VERIFY_CALLER_CHECK"
)

// googleIssuers are the issuers of Google's OIDC tokens. The idtoken
// package checks the signature, expiry and audience, not the issuer.
var googleIssuers = []string{"accounts.google.com", "https://accounts.google.com"}

// callerCheckTimeout bounds a check, including a fetch of Google's keys.
const callerCheckTimeout = 5 * time.Second

// callerCheck admits the verifier's one caller.
type callerCheck struct {
	validator *idtoken.Validator
	audience  string
	email     string
	// keysDownUntil: Google's keys could not be fetched; until then a
	// call is answered 503 without another fetch (so that a flood of
	// well-formed forged tokens does not become a flood of fetches).
	keysDownUntil atomic.Pointer[time.Time]
}

// keysDownFor is how long a failed fetch of Google's keys is remembered:
// the scheduler calls once a minute, so it loses at most the pass a failed
// fetch already cost it.
const keysDownFor = 10 * time.Second

// Errors of a refused call: the first answers 401, the second 403, the
// third 503.
var (
	errNoCallerToken      = errors.New("no valid Google OIDC token")
	errWrongCaller        = errors.New("the token is not the scheduler's")
	errCallerKeysNotFound = errors.New("the keys of Google's tokens could not be fetched")
)

// newCallerCheck reads the check's configuration; nil means the check is
// off. client fetches Google's keys (nil: a default client).
func newCallerCheck(ctx context.Context, getenv func(string) string, client *http.Client) (*callerCheck, error) {
	switch mode := getenv(EnvVerifyCallerCheck); mode {
	case "off":
		return nil, nil
	case "":
	default:
		return nil, fmt.Errorf("functions: %s: %q: leave it unset, or \"off\" for a local or test run", EnvVerifyCallerCheck, mode)
	}
	c := &callerCheck{email: strings.ToLower(strings.TrimSpace(getenv(EnvVerifyCaller))), audience: getenv(EnvVerifyAudience)}
	if !strings.Contains(c.email, "@") {
		return nil, fmt.Errorf("functions: %s: %q: set it to the scheduler's service account email (or %s=off for a local run)", EnvVerifyCaller, getenv(EnvVerifyCaller), EnvVerifyCallerCheck)
	}
	if u, err := url.Parse(c.audience); err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("functions: %s: %q: set it to the verifier service's https URL, the audience of the scheduler's token", EnvVerifyAudience, c.audience)
	}
	var opts []idtoken.ClientOption
	if client != nil {
		opts = append(opts, option.WithHTTPClient(client))
	}
	v, err := idtoken.NewValidator(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("functions: the verifier's caller check: %w", err)
	}
	c.validator = v
	return c, nil
}

// check admits a request carrying the scheduler's Google OIDC token for the
// verifier's audience, and returns one of the errors above (wrapping the
// cause, for the log) otherwise.
func (c *callerCheck) check(ctx context.Context, r *http.Request) error {
	raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || raw == "" {
		return fmt.Errorf("%w: no bearer token in Authorization", errNoCallerToken)
	}
	if until := c.keysDownUntil.Load(); until != nil && time.Now().Before(*until) {
		return fmt.Errorf("%w: a fetch failed within the last %v", errCallerKeysNotFound, keysDownFor)
	}
	ctx, cancel := context.WithTimeout(ctx, callerCheckTimeout)
	defer cancel()
	payload, err := c.validator.Validate(ctx, raw, c.audience)
	if err != nil {
		var urlErr *url.Error
		if errors.As(err, &urlErr) || strings.Contains(err.Error(), "unable to retrieve cert") {
			until := time.Now().Add(keysDownFor)
			c.keysDownUntil.Store(&until)
			return fmt.Errorf("%w: %w", errCallerKeysNotFound, err)
		}
		return fmt.Errorf("%w: %w", errNoCallerToken, err)
	}
	found := false
	for _, iss := range googleIssuers {
		found = found || payload.Issuer == iss
	}
	if !found {
		return fmt.Errorf("%w: issuer %q is not Google's", errNoCallerToken, payload.Issuer)
	}
	email, _ := payload.Claims["email"].(string)
	verified, _ := payload.Claims["email_verified"].(bool)
	if !strings.EqualFold(email, c.email) || !verified {
		return fmt.Errorf("%w: email %q (verified %v), want %q", errWrongCaller, email, verified, c.email)
	}
	return nil
}
