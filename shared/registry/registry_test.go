package registry_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/registry"
)

const valid = `{
  "identity": {"issuer": "https://issuer.example", "audience": "replication", "jwks_url": "https://issuer.example/jwks.json"},
  "workspaces": [{
    "id": "w1", "organization_id": "org-1", "runtime_subject": "runtime-w1",
    "database": {"url": "postgres://user:secret@127.0.0.1:5432/ontology"},
    "pubsub": {"project": "p1", "topic": "ontology-replication"},
    "bigquery": {"project": "p1", "dataset": "ontology_internal", "table": "events", "location": "EU", "endpoint": "http://127.0.0.1:9050"}
  }, {
    "id": "w2", "organization_id": "org-2", "runtime_subject": "runtime-w2",
    "database": {"instance": "proj-1:europe-west1:ontology", "name": "ontology", "user": "drain@proj-1.iam", "iam_auth": true, "private_ip": true},
    "pubsub": {"project": "proj-1", "topic": "ontology-replication"},
    "bigquery": {}
  }]
}`

func TestParseValid(t *testing.T) {
	t.Parallel()
	r, err := registry.Parse([]byte(valid))
	require.NoError(t, err)
	require.Len(t, r.Workspaces, 2)
	w2, ok := r.Workspace("w2")
	require.True(t, ok)
	require.Equal(t, registry.BigQuery{Project: "proj-1", Dataset: "ontology_internal", Table: "events", Partitioning: "ingestion_time"}, w2.BigQuery, "defaults")
	require.Zero(t, w2.Database.MaxConns, "the component's pool size applies")
	require.Equal(t, "ontology-replication-dead-letter", r.Workspaces[0].PubSub.DeadLetterSubscription, "default: terraform's name")
	require.Equal(t, []string{"RS256", "ES256"}, r.Identity.Algorithms)
	require.Equal(t, "projects/p1/topics/ontology-replication", r.Workspaces[0].PubSub.TopicName())
	require.NotContains(t, r.Workspaces[0].Database.Redacted(), "secret")
	_, ok = r.Workspace("w3")
	require.False(t, ok)
}

func TestParseErrorsNameTheField(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, from, to, want string
	}{
		{"not json", `{`, `[`, "invalid JSON"},
		{"unknown field", `"runtime_subject": "runtime-w1",`, `"runtime_subject": "runtime-w1", "topic": "x",`, `unknown field "topic"`},
		{"missing issuer", `"issuer": "https://issuer.example", `, ``, "identity.issuer"},
		{"http jwks", `"jwks_url": "https://issuer.example/jwks.json"`, `"jwks_url": "http://issuer.example/jwks.json"`, "identity.jwks_url"},
		{"alg none", `"audience": "replication",`, `"audience": "replication", "algorithms": ["none"],`, "identity.algorithms[0]"},
		{"hmac", `"audience": "replication",`, `"audience": "replication", "algorithms": ["HS256"],`, "identity.algorithms[0]"},
		{"bad id", `"id": "w1"`, `"id": "w 1"`, "workspaces[0].id"},
		{"duplicate id", `"id": "w2"`, `"id": "w1"`, "workspaces[1] (w1).id: duplicate"},
		{"no organization", `"organization_id": "org-1", `, ``, "workspaces[0] (w1).organization_id"},
		{"no subject", `"runtime_subject": "runtime-w1",`, ``, "workspaces[0] (w1).runtime_subject"},
		{"url and instance", `"database": {"url": "postgres://user:secret@127.0.0.1:5432/ontology"}`, `"database": {"url": "postgres://x@y/z", "instance": "a:b:c"}`, "workspaces[0] (w1).database: set url or instance, not both"},
		{"no database", `"database": {"url": "postgres://user:secret@127.0.0.1:5432/ontology"}`, `"database": {}`, "workspaces[0] (w1).database: set url"},
		{"mysql url", `postgres://user:secret@127.0.0.1:5432/ontology`, `mysql://x/y`, "workspaces[0] (w1).database.url"},
		{"bad instance", `proj-1:europe-west1:ontology`, `ontology`, "workspaces[1] (w2).database.instance"},
		{"password login", `"iam_auth": true`, `"iam_auth": false`, "workspaces[1] (w2).database.iam_auth"},
		{"service account suffix", `drain@proj-1.iam"`, `drain@proj-1.iam.gserviceaccount.com"`, "workspaces[1] (w2).database.user"},
		{"no topic", `"topic": "ontology-replication"},
    "bigquery": {"project"`, `"topic": ""}, "bigquery": {"project"`, "workspaces[0] (w1).pubsub.topic"},
		{"bad project", `"project": "p1", "topic"`, `"project": "P 1", "topic"`, "workspaces[0] (w1).pubsub.project"},
		{"bad dataset", `"dataset": "ontology_internal"`, `"dataset": "a.b"`, "workspaces[0] (w1).bigquery.dataset"},
		{"bad partitioning", `"location": "EU",`, `"location": "EU", "partitioning": "daily",`, "workspaces[0] (w1).bigquery.partitioning"},
		{"bad endpoint", `"endpoint": "http://127.0.0.1:9050"`, `"endpoint": "127.0.0.1:9050"`, "workspaces[0] (w1).bigquery.endpoint"},
		{"too many conns", `"database": {"url": "postgres://user:secret@127.0.0.1:5432/ontology"}`, `"database": {"url": "postgres://x@y/z", "max_conns": 100}`, "workspaces[0] (w1).database.max_conns"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			raw := strings.Replace(valid, c.from, c.to, 1)
			require.NotEqual(t, valid, raw, "the case changes the registry")
			_, err := registry.Parse([]byte(raw))
			require.ErrorContains(t, err, c.want)
			require.NotContains(t, err.Error(), "secret", "no password in errors")
		})
	}
	_, err := registry.Parse([]byte(`{"workspaces": []}`))
	require.ErrorContains(t, err, "workspaces: at least one")
}

func TestIdentityIsOptionalWithoutADrain(t *testing.T) {
	t.Parallel()
	_, err := registry.Parse([]byte(`{"workspaces": [{"id": "w1", "database": {"url": "postgres://x@y/z"}, "pubsub": {"project": "p1", "topic": "t1x"}}]}`))
	require.NoError(t, err)
}

func TestLoad(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "registry.json")
	require.NoError(t, os.WriteFile(file, []byte(valid), 0o600))
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	r, err := registry.Load(env(map[string]string{registry.EnvInline: valid}))
	require.NoError(t, err)
	require.Len(t, r.Workspaces, 2)
	r, err = registry.Load(env(map[string]string{registry.EnvFile: file}))
	require.NoError(t, err)
	require.Len(t, r.Workspaces, 2)
	_, err = registry.Load(env(nil))
	require.ErrorContains(t, err, "REPLICATION_WORKSPACES")
	_, err = registry.Load(env(map[string]string{registry.EnvInline: valid, registry.EnvFile: file}))
	require.ErrorContains(t, err, "not both")
	_, err = registry.Load(env(map[string]string{registry.EnvFile: file + ".missing"}))
	require.ErrorContains(t, err, "REPLICATION_WORKSPACES_FILE")
	_, err = registry.Load(env(map[string]string{registry.EnvInline: `{"workspaces": []}`}))
	require.ErrorContains(t, err, "REPLICATION_WORKSPACES: workspaces")
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(valid))
	f.Add([]byte(`{"workspaces": [{"id": "w1", "database": {"url": "postgres://x@y/z"}, "pubsub": {"project": "p1", "topic": "t1x"}}]}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		r, err := registry.Parse(raw)
		if err != nil {
			return
		}
		// Whatever parses is valid, and stays valid.
		if err := r.Validate(); err != nil {
			t.Fatalf("Parse accepted a registry Validate refuses: %v", err)
		}
		for _, w := range r.Workspaces {
			if _, ok := r.Workspace(w.ID); !ok {
				t.Fatalf("workspace %q not found", w.ID)
			}
		}
	})
}
