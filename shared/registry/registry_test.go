package registry_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
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

// TestRedactedCarriesNoSecret: what is logged of a database URL is its
// user, host, port and database, whatever secret the URL carries and
// wherever.
func TestRedactedCarriesNoSecret(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ url, want string }{
		{"postgres://u:SECRET@db.example.com:5432/ontology?sslmode=require", "postgres://u@db.example.com:5432/ontology"},
		{"postgres://u@127.0.0.1/ontology?password=SECRET&sslmode=bogus", "postgres://u@127.0.0.1/ontology"},
		{"postgresql://u@127.0.0.1/ontology?sslpassword=SECRET&sslkey=/keys/SECRET.key", "postgresql://u@127.0.0.1/ontology"},
		{"host=127.0.0.1 user=u password=SECRET dbname=ontology", "(a connection string that is not a postgres:// URL)"},
		{"postgres://u:SECRET@[::1", "(a connection string that is not a postgres:// URL)"},
	} {
		got := registry.Database{URL: c.url}.Redacted()
		require.Equal(t, c.want, got, c.url)
		require.NotContains(t, got, "SECRET")
	}
	require.Equal(t, "p:r:i/ontology", registry.Database{Instance: "p:r:i", Name: "ontology"}.Redacted())
}

// TestLoadIsBounded: a registry file is read up to registry.MaxBytes, so a
// wrong path (a device that never ends) fails fast instead of exhausting
// memory.
func TestLoadIsBounded(t *testing.T) {
	t.Parallel()
	_, err := registry.Load(func(k string) string {
		if k == registry.EnvFile {
			return "/dev/zero"
		}
		return ""
	})
	require.ErrorContains(t, err, "more than the 16777216 bytes a registry may have")
}

func TestParseValid(t *testing.T) {
	t.Parallel()
	r, err := registry.Parse([]byte(valid))
	require.NoError(t, err)
	require.Len(t, r.Workspaces, 2)
	w2, ok := r.Workspace("w2")
	require.True(t, ok)
	require.Equal(t, registry.BigQuery{Project: "proj-1", Dataset: "ontology_internal", Table: "events", ViewsDataset: "ontology_internal", Partitioning: "ingestion_time"}, w2.BigQuery, "defaults: the views beside the table")
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
		{"http jwks on a name like loopback", `"jwks_url": "https://issuer.example/jwks.json"`, `"jwks_url": "http://127.evil.com/jwks.json"`, "identity.jwks_url"},
		{"http jwks on nip.io", `"jwks_url": "https://issuer.example/jwks.json"`, `"jwks_url": "http://127.0.0.1.nip.io/jwks.json"`, "identity.jwks_url"},
		{"jwks without host", `"jwks_url": "https://issuer.example/jwks.json"`, `"jwks_url": "https:///jwks.json"`, "identity.jwks_url"},
		{"remote endpoint", `"endpoint": "http://127.0.0.1:9050"`, `"endpoint": "https://bigquery.evil.example"`, "workspaces[0] (w1).bigquery.endpoint: \"https://bigquery.evil.example\" is not on a loopback address"},
		{"endpoint on a name like loopback", `"endpoint": "http://127.0.0.1:9050"`, `"endpoint": "http://127.0.0.1.nip.io:9050"`, "workspaces[0] (w1).bigquery.endpoint"},
		{"remote switch without endpoint", `"bigquery": {}`, `"bigquery": {"allow_remote_endpoint": true}`, "workspaces[1] (w2).bigquery.allow_remote_endpoint"},
		{"shared runtime subject", `"runtime_subject": "runtime-w2"`, `"runtime_subject": "runtime-w1"`, "workspaces[1] (w2).runtime_subject: \"runtime-w1\" is workspace w1's too"},
		{"password in the clear", `127.0.0.1:5432/ontology"`, `db.example.com:5432/ontology?sslmode=disable"`, "workspaces[0] (w1).database.url: a password to a remote host needs sslmode"},
		{"password with prefer", `127.0.0.1:5432/ontology"`, `db.example.com:5432/ontology?sslmode=prefer"`, "workspaces[0] (w1).database.url"},
		{"password with the default sslmode", `127.0.0.1:5432/ontology"`, `10.0.0.7/ontology"`, "workspaces[0] (w1).database.url"},
		{"password parameter in the clear", `user:secret@127.0.0.1:5432/ontology"`, `user@db.example.com/ontology?password=secret"`, "workspaces[0] (w1).database.url"},
		{"one remote host of two", `127.0.0.1:5432/ontology"`, `127.0.0.1:5432,db.example.com:5432/ontology"`, "workspaces[0] (w1).database.url"},
		{"a remote host in the host parameter", `127.0.0.1:5432/ontology"`, `127.0.0.1:5432/ontology?host=db.example.com"`, "workspaces[0] (w1).database.url: a password to a remote host needs sslmode"},
		{"ids differing in case", `"id": "w2"`, `"id": "W1"`, "workspaces[1] (W1).id: \"W1\" differs from workspace \"w1\" only in case"},
		{"a key twice", `"id": "w1", `, `"id": "w1", "id": "w9", `, "invalid JSON: workspaces[0]: the key \"id\" is given twice"},
		{"a nested key twice", `"table": "events",`, `"table": "events", "table": "other",`, "workspaces[0].bigquery: the key \"table\" is given twice"},
		{"bad sslmode", `127.0.0.1:5432/ontology"`, `127.0.0.1:5432/ontology?sslmode=bogus"`, "workspaces[0] (w1).database.url: the connection settings do not parse: cannot parse the URL: failed to configure TLS (sslmode is invalid)"},
		{"bad port", `127.0.0.1:5432/ontology"`, `127.0.0.1:99999/ontology"`, "workspaces[0] (w1).database.url: the connection settings do not parse"},
		{"bad connect_timeout", `127.0.0.1:5432/ontology"`, `127.0.0.1:5432/ontology?connect_timeout=soon"`, "workspaces[0] (w1).database.url: the connection settings do not parse: cannot parse the URL: invalid connect_timeout"},
		{"pooled with an instance", `"database": {"url": "postgres://user:secret@127.0.0.1:5432/ontology"}`, `"database": {"instance": "a:b:c", "name": "n", "user": "u", "iam_auth": true, "pooled": true}`, "workspaces[0] (w1).database.pooled: goes with url"},
		{"too many conns", `"database": {"url": "postgres://user:secret@127.0.0.1:5432/ontology"}`, `"database": {"url": "postgres://x@y/z", "max_conns": 100}`, "workspaces[0] (w1).database.max_conns"},
		// Keys spelt as encoding/json matches them are one key: a later
		// spelling must not override what a reader sees first.
		{"a key twice, in upper case", `"id": "w1", `, `"id": "w1", "ID": "evil", `, "workspaces[0]: the key \"ID\" is given twice"},
		{"a key twice, folded (long s)", `"issuer": "https://issuer.example", `, `"issuer": "https://issuer.example", "iſſuer": "https://evil.example", `, "identity: the key \"iſſuer\" is given twice"},
		{"a subject twice, folded", `"runtime_subject": "runtime-w1",`, `"runtime_subject": "runtime-w1", "runtime_ſubject": "sub-attacker",`, "workspaces[0]: the key \"runtime_ſubject\" is given twice"},
		{"a url twice, in upper case", `"url": "postgres://user:secret@127.0.0.1:5432/ontology"`, `"url": "postgres://user:secret@127.0.0.1:5432/ontology", "URL": "postgres://x@evil/db"`, "workspaces[0].database: the key \"URL\" is given twice"},
		{"a kelvin sign", `"table": "events",`, `"table": "events", "\u212aey": 1, "key": 2,`, "workspaces[0].bigquery: the key \"key\" is given twice"},
		{"unknown field, with its path", `"table": "events",`, `"table": "events", "tabel": "x",`, "workspaces[0].bigquery: unknown field \"tabel\""},
		{"a password in the jwks url", `"jwks_url": "https://issuer.example/jwks.json"`, `"jwks_url": "http://u:secret@192.0.2.1/jwks.json"`, "identity.jwks_url: \"http://REDACTED@192.0.2.1/jwks.json\" must be an https URL"},
		{"a password in the endpoint", `"endpoint": "http://127.0.0.1:9050"`, `"endpoint": "https://u:secret@bigquery.evil.example"`, "workspaces[0] (w1).bigquery.endpoint: \"https://REDACTED@bigquery.evil.example\" is not on a loopback address"},
		{"a password in an endpoint that is no URL", `"endpoint": "http://127.0.0.1:9050"`, `"endpoint": "http://u:secret@[::1"`, "is not an http(s) URL"},
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

// TestParseAccepts: the secure forms of what TestParseErrorsNameTheField
// refuses.
func TestParseAccepts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, from, to string }{
		{"http jwks on 127.0.0.1", `"jwks_url": "https://issuer.example/jwks.json"`, `"jwks_url": "http://127.0.0.1:8080/jwks.json"`},
		{"http jwks on ::1", `"jwks_url": "https://issuer.example/jwks.json"`, `"jwks_url": "http://[::1]:8080/jwks.json"`},
		{"http jwks on localhost", `"jwks_url": "https://issuer.example/jwks.json"`, `"jwks_url": "http://localhost:8080/jwks.json"`},
		{"endpoint on localhost", `"endpoint": "http://127.0.0.1:9050"`, `"endpoint": "http://localhost:9050"`},
		{"remote endpoint meant", `"endpoint": "http://127.0.0.1:9050"`, `"endpoint": "https://bq.example", "allow_remote_endpoint": true`},
		{"remote password over TLS", `127.0.0.1:5432/ontology"`, `db.example.com:5432/ontology?sslmode=verify-full"`},
		{"remote password with require", `127.0.0.1:5432/ontology"`, `db.example.com:5432/ontology?sslmode=require"`},
		{"remote without a password", `user:secret@127.0.0.1:5432/ontology"`, `user@db.example.com:5432/ontology"`},
		{"password over a Unix socket", `127.0.0.1:5432/ontology"`, `/ontology?host=/run/postgresql"`},
		{"password on loopback without TLS", `127.0.0.1:5432/ontology"`, `localhost:5432/ontology?sslmode=disable"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			raw := strings.Replace(valid, c.from, c.to, 1)
			require.NotEqual(t, valid, raw, "the case changes the registry")
			_, err := registry.Parse([]byte(raw))
			require.NoError(t, err)
		})
	}
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

// FuzzParse: Parse never panics; what it accepts survives a round trip
// (encoded and parsed again it is the same registry: defaults are stable
// and nothing accepted is lost), and every workspace is found by its id and
// only by it.
func FuzzParse(f *testing.F) {
	f.Add([]byte(valid))
	f.Add([]byte(`{"workspaces": [{"id": "w1", "database": {"url": "postgres://x@y/z"}, "pubsub": {"project": "p1", "topic": "t1x"}}]}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		r, err := registry.Parse(raw)
		if err != nil {
			return
		}
		again, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("an accepted registry does not encode: %v", err)
		}
		r2, err := registry.Parse(again)
		if err != nil {
			t.Fatalf("an accepted registry, encoded, is refused: %v\n%s", err, again)
		}
		if !reflect.DeepEqual(r, r2) {
			t.Fatalf("the round trip changed the registry:\n%+v\n%+v", r, r2)
		}
		for _, w := range r.Workspaces {
			got, ok := r.Workspace(w.ID)
			if !ok || !reflect.DeepEqual(got, w) {
				t.Fatalf("workspace %q not found as itself", w.ID)
			}
			if _, ok := r.Workspace(w.ID + "x"); ok && !slices.ContainsFunc(r.Workspaces, func(o registry.Workspace) bool { return o.ID == w.ID+"x" }) {
				t.Fatalf("workspace %q found though not registered", w.ID+"x")
			}
		}
	})
}

// BenchmarkParseFleet: loading and validating a registry of 10,000
// workspaces (terraform's file for a fleet), and finding one by id.
func BenchmarkParseFleet(b *testing.B) {
	raw := fleetRegistry(10_000)
	b.Run("parse", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := registry.Parse(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	r, err := registry.Parse(raw)
	require.NoError(b, err)
	b.Run("lookup", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, ok := r.Workspace(fmt.Sprintf("w%05d", i%10_000)); !ok {
				b.Fatal("not found")
			}
		}
	})
}

// fleetRegistry is a registry of n Cloud SQL workspaces, as terraform
// writes it.
func fleetRegistry(n int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"identity": {"issuer": "https://issuer.example", "audience": "replication", "jwks_url": "https://issuer.example/jwks.json"}, "workspaces": [`)
	for i := range n {
		if i > 0 {
			sb.WriteString(",")
		}
		fmt.Fprintf(&sb, `{"id": "w%05d", "organization_id": "org-%d", "runtime_subject": "runtime:w%05d",
			"database": {"instance": "proj-1:europe-west1:ontology-%d", "name": "w%05d", "user": "replication-drain@proj-1.iam", "iam_auth": true, "private_ip": true},
			"pubsub": {"project": "proj-1", "topic": "ontology-replication-w%05d"}, "bigquery": {"project": "proj-1", "dataset": "ontology_w%05d", "location": "EU"}}`,
			i, i, i, i%50, i, i, i)
	}
	sb.WriteString("]}")
	return []byte(sb.String())
}

// TestFleetRegistry: 10,000 workspaces load, and each is found.
func TestFleetRegistry(t *testing.T) {
	t.Parallel()
	r, err := registry.Parse(fleetRegistry(10_000))
	require.NoError(t, err)
	require.Len(t, r.Workspaces, 10_000)
	for i := range 10_000 {
		w, ok := r.Workspace(fmt.Sprintf("w%05d", i))
		require.True(t, ok)
		require.Equal(t, fmt.Sprintf("runtime:w%05d", i), w.RuntimeSubject)
	}
	_, ok := r.Workspace("w10000")
	require.False(t, ok)
}

// TestHostileRegistriesAreRefusedQuickly: registries made to hurt the
// parser (20,000 nested arrays in an unknown field, a 1 MB id, a password
// in every URL) are refused at once, with an error of a few KB at most that
// names no secret.
func TestHostileRegistriesAreRefusedQuickly(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, raw, want string
	}{
		{"nested arrays", strings.Replace(valid, `"runtime_subject": "runtime-w1",`,
			`"runtime_subject": "runtime-w1", "x": `+strings.Repeat("[", 20_000)+strings.Repeat("]", 20_000)+`,`, 1), "nested deeper than 32 levels"},
		{"a 1 MB id", strings.Replace(valid, `"id": "w1"`, `"id": "`+strings.Repeat("w", 1<<20)+`"`, 1), "workspaces[0].id: \"wwww"},
		{"a 1 MB key given twice", strings.Replace(valid, `"id": "w1", `, `"id": "w1", "`+strings.Repeat("k", 1<<20)+`": 1, "`+strings.Repeat("K", 1<<20)+`": 2, `, 1),
			"workspaces[0]: the key \"kkkk"},
		{"a key one byte too long", strings.Replace(valid, `"id": "w1", `, `"id": "w1", "`+strings.Repeat("k", 257)+`": 1, `, 1), "longer than any key of a registry"},
		{"an 8 MB key", `{"` + strings.Repeat("k", 8_000_000) + `": 1}`, "the top level: the key \"kkkk"},
		{"nested one level too deep", strings.Replace(valid, `"runtime_subject": "runtime-w1",`,
			`"runtime_subject": "runtime-w1", "x": `+strings.Repeat("[", 30)+strings.Repeat("]", 30)+`,`, 1), "nested deeper than 32 levels"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := registry.Parse([]byte(c.raw))
			require.ErrorContains(t, err, c.want)
			require.Less(t, len(err.Error()), 4096, "the error quotes a bounded part of what it refuses")
			require.NotContains(t, err.Error(), "secret")
		})
	}
}

// TestARegistryAtTheBoundsIsRead: a key of maxKeyBytes and nesting of
// exactly 32 levels pass the scan (and are then refused as the unknown
// fields they are, not as hostile).
func TestARegistryAtTheBoundsIsRead(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, raw string }{
		{"a 256-byte key", strings.Replace(valid, `"id": "w1", `, `"id": "w1", "`+strings.Repeat("k", 256)+`": 1, `, 1)},
		{"32 levels", strings.Replace(valid, `"runtime_subject": "runtime-w1",`,
			`"runtime_subject": "runtime-w1", "x": `+strings.Repeat("[", 29)+strings.Repeat("]", 29)+`,`, 1)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := registry.Parse([]byte(c.raw))
			require.ErrorContains(t, err, "unknown field")
		})
	}
}

// TestAHugeKeyCostsInProportionToItself: an 8 MB key (half the registry's
// cap) is refused with a few times its own size allocated, not tens
// (measured before the key bound: 179 MB, 0.57 s; after: 31 MB, 45 ms).
// Not parallel: the count is the process's.
func TestAHugeKeyCostsInProportionToItself(t *testing.T) {
	raw := []byte(`{"workspaces": [{"id": "w1", "` + strings.Repeat("k", 8_000_000) + `": 1}]}`)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := registry.Parse(raw)
	runtime.ReadMemStats(&after)
	require.ErrorContains(t, err, "workspaces[0]: the key")
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d MB allocated to refuse an %d MB key", allocated>>20, len(raw)>>20)
	require.Less(t, allocated, uint64(6*len(raw)), "allocated %d bytes", allocated)
}
