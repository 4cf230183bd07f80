package registry

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

var (
	idPattern       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	projectPattern  = regexp.MustCompile(`^[a-z]([a-z0-9.:-]{0,98}[a-z0-9])?$`)
	topicPattern    = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9._~+%-]{2,254}$`)
	bqNamePattern   = regexp.MustCompile(`^[A-Za-z0-9_]{1,1000}$`)
	instancePattern = regexp.MustCompile(`^[a-z][a-z0-9.:-]*:[a-z0-9-]+:[a-z][a-z0-9-]*$`)
	serverPattern   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.:_-]{0,127}$`)
	algorithms      = map[string]bool{"RS256": true, "RS384": true, "RS512": true, "PS256": true, "PS384": true, "PS512": true, "ES256": true, "ES384": true, "ES512": true, "EdDSA": true}
)

// Validate reports the first invalid field, named by its JSON path.
func (r *Registry) Validate() error {
	if err := r.Identity.validate(); err != nil {
		return err
	}
	if len(r.Workspaces) == 0 {
		return errors.New("workspaces: at least one workspace is required")
	}
	seen := make(map[string]string, len(r.Workspaces)) // lower-cased id → id
	subjects := make(map[string]string, len(r.Workspaces))
	for i, w := range r.Workspaces {
		at := fmt.Sprintf("workspaces[%d]", i)
		if !idPattern.MatchString(w.ID) {
			return fmt.Errorf("%s.id: %s must be 1–128 letters, digits, '.', '_' or '-'", at, bounded(w.ID))
		}
		at = fmt.Sprintf("workspaces[%d] (%s)", i, w.ID)
		// Ids differ in more than case: a path segment or a log filter that
		// folds case must not take one workspace for another.
		if other, ok := seen[strings.ToLower(w.ID)]; ok {
			if other == w.ID {
				return fmt.Errorf("%s.id: duplicate workspace id", at)
			}
			return fmt.Errorf("%s.id: %s differs from workspace %s only in case", at, bounded(w.ID), bounded(other))
		}
		seen[strings.ToLower(w.ID)] = w.ID
		if r.Identity.Configured() {
			if w.OrganizationID == "" {
				return fmt.Errorf("%s.organization_id: required", at)
			}
			if w.RuntimeSubject == "" {
				return fmt.Errorf("%s.runtime_subject: required", at)
			}
		}
		if w.RuntimeSubject != "" {
			if other, ok := subjects[w.RuntimeSubject]; ok {
				return fmt.Errorf("%s.runtime_subject: %s is workspace %s's too: one token would drain both", at, bounded(w.RuntimeSubject), other)
			}
			subjects[w.RuntimeSubject] = w.ID
		}
		if err := w.Database.validate(at + ".database"); err != nil {
			return err
		}
		if err := w.PubSub.validate(at + ".pubsub"); err != nil {
			return err
		}
		if err := w.BigQuery.validate(at + ".bigquery"); err != nil {
			return err
		}
	}
	return nil
}

// validate checks the identity section, when there is one.
func (id Identity) validate() error {
	if !id.Configured() {
		return nil
	}
	switch {
	case id.Issuer == "":
		return errors.New("identity.issuer: required")
	case id.Audience == "":
		return errors.New("identity.audience: required")
	case id.JWKSURL == "":
		return errors.New("identity.jwks_url: required")
	}
	if u, err := url.Parse(id.JWKSURL); err != nil || u.Host == "" || (u.Scheme != "https" && !(u.Scheme == "http" && isLoopback(u.Hostname()))) {
		return fmt.Errorf("identity.jwks_url: %s must be an https URL (http only on loopback)", redactedURL(id.JWKSURL))
	}
	for i, a := range id.Algorithms {
		if !algorithms[a] {
			return fmt.Errorf("identity.algorithms[%d]: %s is not an accepted signature algorithm (want RS256, ES256, …; never none or HS*)", i, bounded(a))
		}
	}
	return nil
}

// validate checks a workspace's Pub/Sub names (at: the field's path).
func (p PubSub) validate(at string) error {
	if !projectPattern.MatchString(p.Project) {
		return fmt.Errorf("%s.project: %s is not a Google Cloud project id", at, bounded(p.Project))
	}
	if !topicPattern.MatchString(p.Topic) || strings.HasPrefix(p.Topic, "goog") {
		return fmt.Errorf("%s.topic: %s is not a Pub/Sub topic id", at, bounded(p.Topic))
	}
	if sub := p.DeadLetterSubscription; !topicPattern.MatchString(sub) || strings.HasPrefix(sub, "goog") {
		return fmt.Errorf("%s.dead_letter_subscription: %s is not a Pub/Sub subscription id", at, bounded(sub))
	}
	return nil
}

// validate checks a workspace's BigQuery names and endpoint (at: the
// field's path).
func (bq BigQuery) validate(at string) error {
	if !projectPattern.MatchString(bq.Project) {
		return fmt.Errorf("%s.project: %s is not a Google Cloud project id", at, bounded(bq.Project))
	}
	if !bqNamePattern.MatchString(bq.Dataset) {
		return fmt.Errorf("%s.dataset: %s must be letters, digits and underscores", at, bounded(bq.Dataset))
	}
	if !bqNamePattern.MatchString(bq.ViewsDataset) {
		return fmt.Errorf("%s.views_dataset: %s must be letters, digits and underscores", at, bounded(bq.ViewsDataset))
	}
	if !bqNamePattern.MatchString(bq.Table) {
		return fmt.Errorf("%s.table: %s must be letters, digits and underscores", at, bounded(bq.Table))
	}
	if bq.Partitioning != PartitioningIngestionTime && bq.Partitioning != PartitioningNone {
		return fmt.Errorf("%s.partitioning: %s must be %q or %q", at, bounded(bq.Partitioning), PartitioningIngestionTime, PartitioningNone)
	}
	if bq.Endpoint == "" {
		if bq.AllowRemoteEndpoint {
			return fmt.Errorf("%s.allow_remote_endpoint: set without an endpoint", at)
		}
		return nil
	}
	u, err := url.Parse(bq.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s.endpoint: %s is not an http(s) URL", at, redactedURL(bq.Endpoint))
	}
	if !isLoopback(u.Hostname()) && !bq.AllowRemoteEndpoint {
		return fmt.Errorf("%s.endpoint: %s is not on a loopback address: an endpoint turns authentication off, so only a local or test server may be named (set allow_remote_endpoint to mean it)", at, redactedURL(bq.Endpoint))
	}
	return nil
}

func (d Database) validate(at string) error {
	switch {
	case d.URL != "" && d.Instance != "":
		return fmt.Errorf("%s: set url or instance, not both", at)
	case d.URL == "" && d.Instance == "":
		return fmt.Errorf("%s: set url (postgres://…) or instance (project:region:instance)", at)
	case d.MaxConns < 0 || d.MaxConns > 32:
		return fmt.Errorf("%s.max_conns: %d must be between 1 and 32 (or omitted)", at, d.MaxConns)
	case d.Server != "" && !serverPattern.MatchString(d.Server):
		return fmt.Errorf("%s.server: %s must be 1–128 letters, digits, '.', ':', '_' or '-'", at, bounded(d.Server))
	}
	if d.URL != "" {
		u, err := url.Parse(d.URL)
		if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			return fmt.Errorf("%s.url: must be a postgres:// URL", at)
		}
		if d.Name != "" || d.User != "" || d.IAMAuth || d.PrivateIP {
			return fmt.Errorf("%s: name, user, iam_auth and private_ip go with instance, not url", at)
		}
		if err := checkSettings(at+".url", d.URL); err != nil {
			return err
		}
		return checkTransport(at+".url", u)
	}
	switch {
	case d.Pooled:
		return fmt.Errorf("%s.pooled: goes with url: a pooler is reached by its address (Cloud SQL's Managed Connection Pooling through the Cloud SQL Auth Proxy, not the Go connector)", at)
	case !instancePattern.MatchString(d.Instance):
		return fmt.Errorf("%s.instance: %s must be project:region:instance", at, bounded(d.Instance))
	case d.Name == "":
		return fmt.Errorf("%s.name: required with instance", at)
	case d.User == "":
		return fmt.Errorf("%s.user: required with instance", at)
	case !d.IAMAuth:
		return fmt.Errorf("%s.iam_auth: must be true: Cloud SQL databases are reached with IAM database login, never a password", at)
	case strings.HasSuffix(d.User, ".gserviceaccount.com"):
		return fmt.Errorf("%s.user: %s: an IAM database user is the service account's email without .gserviceaccount.com", at, bounded(d.User))
	}
	return nil
}

// checkTransport refuses a password sent in the clear: a URL naming a
// host other than loopback (or a Unix socket) with a password must set an
// sslmode that insists on TLS (libpq's default, prefer, falls back to
// plain text).
func checkTransport(at string, u *url.URL) error {
	q := u.Query()
	_, hasPassword := u.User.Password()
	if q.Get("password") != "" {
		hasPassword = true
	}
	if !hasPassword {
		return nil
	}
	hosts := strings.Split(u.Host, ",")
	if h := q.Get("host"); h != "" {
		hosts = strings.Split(h, ",")
	}
	remote := false
	for _, h := range hosts {
		if strings.HasPrefix(h, "/") || h == "" {
			continue // a Unix socket
		}
		if host, _, err := net.SplitHostPort(h); err == nil {
			h = host
		}
		if !isLoopback(strings.Trim(h, "[]")) {
			remote = true
		}
	}
	switch q.Get("sslmode") {
	case "require", "verify-ca", "verify-full":
		return nil
	}
	if remote {
		return fmt.Errorf("%s: a password to a remote host needs sslmode=require, verify-ca or verify-full (the default, prefer, and disable or allow can send it in the clear)", at)
	}
	return nil
}

// isLoopback reports whether host is localhost or a loopback IP address
// (not a name that merely starts like one, such as 127.0.0.1.nip.io).
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// quoted is a quoted part of an error message: pgx quotes the connection
// string it could not parse (with its passwords masked) in backticks.
var quoted = regexp.MustCompile("`[^`]*`")

// checkSettings parses the URL's connection settings as the pools will
// (sslmode, port, connect_timeout, …), so that a bad one is reported at
// start-up naming the field, never at a wake-up; the message carries
// none of the URL.
func checkSettings(at, raw string) error {
	if _, err := pgconn.ParseConfig(raw); err != nil {
		return fmt.Errorf("%s: the connection settings do not parse: %s", at, quoted.ReplaceAllString(err.Error(), "the URL"))
	}
	return nil
}

// redactedURL quotes a URL for an error line without what its userinfo
// carries (a password, a token), cut as bounded cuts a value; what does not
// parse as a URL is not echoed at all.
func redactedURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Sprintf("(a value of %d bytes that is not a URL)", len(raw))
	}
	if u.User != nil {
		u.User = url.User("REDACTED")
	}
	return bounded(u.String())
}
