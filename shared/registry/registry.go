package registry

// The registry's shape, the interface its JSON field names are, and how it
// is read; validate.go checks each field with a message that names it.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
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
	// Server names the PostgreSQL server the database lives on, for the
	// per-server connection budget (DATABASE_SERVER_MAX_CONNS): databases
	// with the same server share one budget. Default: the Cloud SQL
	// instance, or else the URL's host as it resolves (every loopback
	// address is one server; a name and the address it resolves to are
	// one). Set it when one server is reached by addresses the process
	// cannot tie together (an IPv4 address in one URL, an IPv6 address in
	// another, a proxy).
	Server string `json:"server,omitempty"`
	// Pooled says the URL reaches the database through a connection pooler
	// in session mode (PgBouncer; Cloud SQL's Managed Connection Pooling),
	// which keeps warm server connections per database and user for its
	// clients: the way to a server that holds many workspace databases
	// (README, Connections to the SDK's database). The process then sends no
	// startup parameter a pooler refuses (the session's timeouts are set
	// after it connects) and closes a connection once its caller releases
	// it (a drainer at the end of its run), so that the pooler's server
	// connection serves another client: the pooler keeps it warm. A pooler in transaction or statement mode breaks the
	// drain's session locks: it must run in session mode. With url only.
	Pooled bool `json:"pooled,omitempty"`
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
		if len(inline) > MaxBytes {
			return nil, fmt.Errorf("registry: %s: %d bytes, more than the %d a registry may have", EnvInline, len(inline), MaxBytes)
		}
		r, err := Parse([]byte(inline))
		if err != nil {
			return nil, fmt.Errorf("registry: %s: %w", EnvInline, err)
		}
		return r, nil
	case file != "":
		raw, err := readBounded(file)
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

// MaxBytes bounds a registry: 16 MiB, room for tens of thousands of
// workspaces (Secret Manager, where terraform keeps it, takes 64 KiB a
// version), and a bound on what a wrong path (a device, a log file) can
// make the process read.
const MaxBytes = 16 << 20

// readBounded reads a registry file of at most MaxBytes.
func readBounded(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > MaxBytes {
		return nil, fmt.Errorf("more than the %d bytes a registry may have", MaxBytes)
	}
	return raw, nil
}

// Parse decodes and validates a registry. Unknown fields are errors, so a
// misspelt field is caught at start-up, and so is a field given twice in
// one object (JSON decoders differ on which of the two wins).
func Parse(raw []byte) (*Registry, error) {
	if len(raw) > MaxBytes {
		return nil, fmt.Errorf("%d bytes, more than the %d a registry may have", len(raw), MaxBytes)
	}
	if err := checkDuplicateKeys(raw); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var r Registry
	if err := dec.Decode(&r); err != nil {
		if m := unknownField.FindStringSubmatch(err.Error()); m != nil {
			if at := keyPath(raw, m[1]); at != "" {
				return nil, fmt.Errorf("invalid JSON: %s: unknown field %s", at, bounded(m[1]))
			}
			return nil, fmt.Errorf("invalid JSON: unknown field %s", bounded(m[1]))
		}
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

// Redacted says where the database is, safe to log: the Cloud SQL instance
// and database, or, of a URL, only its user, host, port and database,
// never a password or any other setting, wherever the URL carries it
// (userinfo, password or sslpassword parameters, a key's path).
func (d Database) Redacted() string {
	if d.URL == "" {
		return d.Instance + "/" + d.Name
	}
	u, err := url.Parse(d.URL)
	if err != nil || u.Scheme == "" || u.Opaque != "" {
		return "(a connection string that is not a postgres:// URL)"
	}
	out := &url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}
	if u.User != nil {
		out.User = url.User(u.User.Username())
	}
	return out.String()
}

// unknownField is encoding/json's error for a field no struct has.
var unknownField = regexp.MustCompile(`^json: unknown field "(.*)"$`)
