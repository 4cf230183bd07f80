package registry

// This file is long because it is one thing: the registry's shape, the
// interface its JSON field names are, and the validation of each field
// with a message that names it.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
)

// Environment variables the registry is read from.
const (
	// EnvInline holds the registry JSON itself.
	EnvInline = "REPLICATION_WORKSPACES"
	// EnvFile names a file holding the registry JSON.
	EnvFile = "REPLICATION_WORKSPACES_FILE"
)

// Registry is the workspace registry: which workspaces this deployment
// serves, where their data lives and whom their drain trusts.
type Registry struct {
	// Identity configures runtime token verification for the drain. It may
	// be omitted where no drain runs (the verifier, the job).
	Identity Identity `json:"identity"`
	// Workspaces are the workspaces served; ids are unique. Parse indexes
	// them: change none afterwards.
	Workspaces []Workspace `json:"workspaces"`

	// byID indexes Workspaces by id (built by Parse; a Registry built
	// otherwise is searched).
	byID map[string]int
}

// Identity says which runtime identity tokens the drain accepts.
type Identity struct {
	// Issuer is the tokens' required iss claim.
	Issuer string `json:"issuer"`
	// Audience is the audience the tokens must name (aud claim).
	Audience string `json:"audience"`
	// JWKSURL is where the issuer's signing keys are published.
	JWKSURL string `json:"jwks_url"`
	// Algorithms are the accepted signature algorithms. Default: RS256 and ES256.
	Algorithms []string `json:"algorithms,omitempty"`
	// TokenType, when set, is the typ header every token must carry (for
	// example "JWT" or "at+jwt"), compared as RFC 7515 says.
	TokenType string `json:"token_type,omitempty"`
	// OrganizationClaim, when set, names the claim carrying the token's
	// organisation id: it must be the workspace's organization_id (as the
	// x-segmentstream-organization-id header must).
	OrganizationClaim string `json:"organization_claim,omitempty"`
}

// Configured reports whether any identity field is set.
func (i Identity) Configured() bool {
	return i.Issuer != "" || i.Audience != "" || i.JWKSURL != "" || len(i.Algorithms) > 0 || i.TokenType != "" || i.OrganizationClaim != ""
}

// Workspace is one workspace's configuration.
type Workspace struct {
	// ID is the workspace id, as in the drain's URL path.
	ID string `json:"id"`
	// OrganizationID must match the x-segmentstream-organization-id header.
	OrganizationID string `json:"organization_id"`
	// RuntimeSubject is the sub claim of the workspace runtime's token.
	RuntimeSubject string `json:"runtime_subject"`
	// Database is the workspace's ontology database.
	Database Database `json:"database"`
	// PubSub is the topic events are published to.
	PubSub PubSub `json:"pubsub"`
	// BigQuery is the table the topic's BigQuery subscription writes to.
	BigQuery BigQuery `json:"bigquery"`
}

// Database locates an ontology database: either URL (a postgres:// URL, for
// local use) or a Cloud SQL instance.
type Database struct {
	// URL is a postgres:// connection URL.
	URL string `json:"url,omitempty"`
	// Instance is the Cloud SQL instance connection name, project:region:instance.
	Instance string `json:"instance,omitempty"`
	// Name is the database name on the instance.
	Name string `json:"name,omitempty"`
	// User is the database user; with IAM login, the service account's email
	// without ".gserviceaccount.com".
	User string `json:"user,omitempty"`
	// IAMAuth logs in with the service account's IAM identity.
	IAMAuth bool `json:"iam_auth,omitempty"`
	// PrivateIP connects to the instance's private IP.
	PrivateIP bool `json:"private_ip,omitempty"`
	// MaxConns caps each process's connections to the database. Default:
	// the component's pool size (DATABASE_POOL_SIZE; 2 for the drain and
	// the verifier, 4 for the job).
	MaxConns int32 `json:"max_conns,omitempty"`
}

// PubSub is a workspace's Pub/Sub topic.
type PubSub struct {
	// Project is the topic's Google Cloud project.
	Project string `json:"project"`
	// Topic is the topic id.
	Topic string `json:"topic"`
	// DeadLetterSubscription is the subscription that keeps the messages
	// the BigQuery subscription dead-lettered, in the same project.
	// Default: <topic>-dead-letter, as terraform/ names it.
	DeadLetterSubscription string `json:"dead_letter_subscription,omitempty"`
}

// TopicName is the topic's full resource name.
func (p PubSub) TopicName() string { return "projects/" + p.Project + "/topics/" + p.Topic }

// DeadLetterSubscriptionName is the dead-letter subscription's full
// resource name.
func (p PubSub) DeadLetterSubscriptionName() string {
	return "projects/" + p.Project + "/subscriptions/" + p.DeadLetterSubscription
}

// BigQuery is a workspace's events table.
type BigQuery struct {
	// Project is the table's project. Default: the Pub/Sub project.
	Project string `json:"project"`
	// Dataset is the table's dataset. Default: ontology_internal.
	Dataset string `json:"dataset"`
	// Table is the events table. Default: events.
	Table string `json:"table"`
	// ViewsDataset is the dataset `job views` creates the latest-state
	// views in, in the same project: one of its own (terraform's default,
	// "ontology"), so that the job's role to create views is not held on
	// the dataset of the events table, the verification evidence. Default:
	// Dataset (the views beside the table).
	ViewsDataset string `json:"views_dataset,omitempty"`
	// Location is the dataset's location, sent with every query (e.g. EU).
	Location string `json:"location,omitempty"`
	// Endpoint points the BigQuery client at a local or test server, with
	// no authentication. Empty in production.
	Endpoint string `json:"endpoint,omitempty"`
	// AllowRemoteEndpoint accepts an Endpoint that is not on a loopback
	// address. An endpoint turns authentication off, and a wrong one can
	// "verify" anything: without this switch only a local or test server
	// may be named.
	AllowRemoteEndpoint bool `json:"allow_remote_endpoint,omitempty"`
	// Partitioning is how the table is partitioned: "ingestion_time" (the
	// default, as terraform/ creates it: daily on _PARTITIONTIME) lets the
	// verifier's lookup prune partitions; "none" for an unpartitioned table.
	Partitioning string `json:"partitioning,omitempty"`
}

// Partitioning values.
const (
	PartitioningIngestionTime = "ingestion_time"
	PartitioningNone          = "none"
)

// Load reads the registry from REPLICATION_WORKSPACES or, when that is
// empty, the file named by REPLICATION_WORKSPACES_FILE, and validates it.
func Load(getenv func(string) string) (*Registry, error) {
	inline, file := getenv(EnvInline), getenv(EnvFile)
	switch {
	case inline != "" && file != "":
		return nil, fmt.Errorf("registry: set %s or %s, not both", EnvInline, EnvFile)
	case inline != "":
		r, err := Parse([]byte(inline))
		if err != nil {
			return nil, fmt.Errorf("registry: %s: %w", EnvInline, err)
		}
		return r, nil
	case file != "":
		raw, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("registry: %s: %w", EnvFile, err)
		}
		r, err := Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("registry: %s (%s): %w", EnvFile, file, err)
		}
		return r, nil
	}
	return nil, fmt.Errorf("registry: no workspace registry: set %s (JSON) or %s (a file)", EnvInline, EnvFile)
}

// Parse decodes and validates a registry. Unknown fields are errors, so a
// misspelt field is caught at start-up.
func Parse(raw []byte) (*Registry, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var r Registry
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if dec.More() {
		return nil, errors.New("invalid JSON: more than one value")
	}
	r.applyDefaults()
	if err := r.Validate(); err != nil {
		return nil, err
	}
	r.byID = make(map[string]int, len(r.Workspaces))
	for i, w := range r.Workspaces {
		r.byID[w.ID] = i
	}
	return &r, nil
}

func (r *Registry) applyDefaults() {
	if len(r.Identity.Algorithms) == 0 && r.Identity.Configured() {
		r.Identity.Algorithms = []string{"RS256", "ES256"}
	}
	for i := range r.Workspaces {
		w := &r.Workspaces[i]
		if w.PubSub.DeadLetterSubscription == "" && w.PubSub.Topic != "" {
			w.PubSub.DeadLetterSubscription = w.PubSub.Topic + "-dead-letter"
		}
		if w.BigQuery.Project == "" {
			w.BigQuery.Project = w.PubSub.Project
		}
		if w.BigQuery.Dataset == "" {
			w.BigQuery.Dataset = "ontology_internal"
		}
		if w.BigQuery.Table == "" {
			w.BigQuery.Table = "events"
		}
		if w.BigQuery.ViewsDataset == "" {
			w.BigQuery.ViewsDataset = w.BigQuery.Dataset
		}
		if w.BigQuery.Partitioning == "" {
			w.BigQuery.Partitioning = PartitioningIngestionTime
		}
	}
}

var (
	idPattern       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	projectPattern  = regexp.MustCompile(`^[a-z]([a-z0-9.:-]{0,98}[a-z0-9])?$`)
	topicPattern    = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9._~+%-]{2,254}$`)
	bqNamePattern   = regexp.MustCompile(`^[A-Za-z0-9_]{1,1000}$`)
	instancePattern = regexp.MustCompile(`^[a-z][a-z0-9.:-]*:[a-z0-9-]+:[a-z][a-z0-9-]*$`)
	algorithms      = map[string]bool{"RS256": true, "RS384": true, "RS512": true, "PS256": true, "PS384": true, "PS512": true, "ES256": true, "ES384": true, "ES512": true, "EdDSA": true}
)

// Validate reports the first invalid field, named by its JSON path.
func (r *Registry) Validate() error {
	if r.Identity.Configured() {
		id := r.Identity
		switch {
		case id.Issuer == "":
			return errors.New("identity.issuer: required")
		case id.Audience == "":
			return errors.New("identity.audience: required")
		case id.JWKSURL == "":
			return errors.New("identity.jwks_url: required")
		}
		if u, err := url.Parse(id.JWKSURL); err != nil || u.Host == "" || (u.Scheme != "https" && !(u.Scheme == "http" && isLoopback(u.Hostname()))) {
			return fmt.Errorf("identity.jwks_url: %q must be an https URL (http only on loopback)", id.JWKSURL)
		}
		for i, a := range id.Algorithms {
			if !algorithms[a] {
				return fmt.Errorf("identity.algorithms[%d]: %q is not an accepted signature algorithm (want RS256, ES256, …; never none or HS*)", i, a)
			}
		}
	}
	if len(r.Workspaces) == 0 {
		return errors.New("workspaces: at least one workspace is required")
	}
	seen := make(map[string]bool, len(r.Workspaces))
	subjects := make(map[string]string, len(r.Workspaces))
	for i, w := range r.Workspaces {
		at := fmt.Sprintf("workspaces[%d]", i)
		if !idPattern.MatchString(w.ID) {
			return fmt.Errorf("%s.id: %q must be 1–128 letters, digits, '.', '_' or '-'", at, w.ID)
		}
		at = fmt.Sprintf("workspaces[%d] (%s)", i, w.ID)
		if seen[w.ID] {
			return fmt.Errorf("%s.id: duplicate workspace id", at)
		}
		seen[w.ID] = true
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
				return fmt.Errorf("%s.runtime_subject: %q is workspace %s's too: one token would drain both", at, w.RuntimeSubject, other)
			}
			subjects[w.RuntimeSubject] = w.ID
		}
		if err := w.Database.validate(at + ".database"); err != nil {
			return err
		}
		if !projectPattern.MatchString(w.PubSub.Project) {
			return fmt.Errorf("%s.pubsub.project: %q is not a Google Cloud project id", at, w.PubSub.Project)
		}
		if !topicPattern.MatchString(w.PubSub.Topic) || strings.HasPrefix(w.PubSub.Topic, "goog") {
			return fmt.Errorf("%s.pubsub.topic: %q is not a Pub/Sub topic id", at, w.PubSub.Topic)
		}
		if sub := w.PubSub.DeadLetterSubscription; !topicPattern.MatchString(sub) || strings.HasPrefix(sub, "goog") {
			return fmt.Errorf("%s.pubsub.dead_letter_subscription: %q is not a Pub/Sub subscription id", at, sub)
		}
		bq := w.BigQuery
		if !projectPattern.MatchString(bq.Project) {
			return fmt.Errorf("%s.bigquery.project: %q is not a Google Cloud project id", at, bq.Project)
		}
		if !bqNamePattern.MatchString(bq.Dataset) {
			return fmt.Errorf("%s.bigquery.dataset: %q must be letters, digits and underscores", at, bq.Dataset)
		}
		if !bqNamePattern.MatchString(bq.ViewsDataset) {
			return fmt.Errorf("%s.bigquery.views_dataset: %q must be letters, digits and underscores", at, bq.ViewsDataset)
		}
		if !bqNamePattern.MatchString(bq.Table) {
			return fmt.Errorf("%s.bigquery.table: %q must be letters, digits and underscores", at, bq.Table)
		}
		if bq.Partitioning != PartitioningIngestionTime && bq.Partitioning != PartitioningNone {
			return fmt.Errorf("%s.bigquery.partitioning: %q must be %q or %q", at, bq.Partitioning, PartitioningIngestionTime, PartitioningNone)
		}
		if bq.Endpoint != "" {
			u, err := url.Parse(bq.Endpoint)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("%s.bigquery.endpoint: %q is not an http(s) URL", at, bq.Endpoint)
			}
			if !isLoopback(u.Hostname()) && !bq.AllowRemoteEndpoint {
				return fmt.Errorf("%s.bigquery.endpoint: %q is not on a loopback address: an endpoint turns authentication off, so only a local or test server may be named (set allow_remote_endpoint to mean it)", at, bq.Endpoint)
			}
		} else if bq.AllowRemoteEndpoint {
			return fmt.Errorf("%s.bigquery.allow_remote_endpoint: set without an endpoint", at)
		}
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
	}
	if d.URL != "" {
		u, err := url.Parse(d.URL)
		if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			return fmt.Errorf("%s.url: must be a postgres:// URL", at)
		}
		if d.Name != "" || d.User != "" || d.IAMAuth || d.PrivateIP {
			return fmt.Errorf("%s: name, user, iam_auth and private_ip go with instance, not url", at)
		}
		return checkTransport(at+".url", u)
	}
	switch {
	case !instancePattern.MatchString(d.Instance):
		return fmt.Errorf("%s.instance: %q must be project:region:instance", at, d.Instance)
	case d.Name == "":
		return fmt.Errorf("%s.name: required with instance", at)
	case d.User == "":
		return fmt.Errorf("%s.user: required with instance", at)
	case !d.IAMAuth:
		return fmt.Errorf("%s.iam_auth: must be true: Cloud SQL databases are reached with IAM database login, never a password", at)
	case strings.HasSuffix(d.User, ".gserviceaccount.com"):
		return fmt.Errorf("%s.user: %q: an IAM database user is the service account's email without .gserviceaccount.com", at, d.User)
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

// Workspace returns the workspace with the given id.
func (r *Registry) Workspace(id string) (Workspace, bool) {
	if r.byID != nil {
		if i, ok := r.byID[id]; ok {
			return r.Workspaces[i], true
		}
		return Workspace{}, false
	}
	for _, w := range r.Workspaces {
		if w.ID == id {
			return w, true
		}
	}
	return Workspace{}, false
}

// Redacted returns a copy safe to log: database URLs lose their passwords.
func (d Database) Redacted() string {
	if d.URL == "" {
		return d.Instance + "/" + d.Name
	}
	u, err := url.Parse(d.URL)
	if err != nil {
		return "(invalid url)"
	}
	return u.Redacted()
}
