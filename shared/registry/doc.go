// Package registry reads and validates the workspace registry: the JSON, from
// REPLICATION_WORKSPACES or the file named by REPLICATION_WORKSPACES_FILE,
// that says which workspaces a deployment serves, where each one's database,
// Pub/Sub topic and BigQuery table are, and which runtime tokens its drain
// accepts.
//
// It is validated once, at start-up: every error names the field at fault by
// its JSON path, such as "workspaces[1] (w2).pubsub.topic: …", and unknown
// fields are rejected so a misspelling is caught before it matters.
//
//	{
//	  "identity": {"issuer": "https://…", "audience": "…", "jwks_url": "https://…/jwks.json"},
//	  "workspaces": [{
//	    "id": "w1", "organization_id": "org-1", "runtime_subject": "…",
//	    "database": {"url": "postgres://user@127.0.0.1:5432/ontology"},
//	    "pubsub": {"project": "p1", "topic": "ontology-replication"},
//	    "bigquery": {"project": "p1", "dataset": "ontology_internal", "table": "events", "location": "EU"}
//	  }]
//	}
//
// On Cloud SQL, database is {"instance": "project:region:instance", "name":
// "ontology", "user": "sa-name@project.iam", "iam_auth": true, "private_ip":
// true} instead of url (IAM database login through cloudsqlconn).
//
// The optional fields: database.max_conns overrides the process's pool size
// for that workspace (and database.server names the server one connection
// budget counts, for a server reached by addresses nothing ties together);
// database.pooled says the url reaches a connection pooler in session mode
// (see Database.Pooled: a server holding many workspace databases);
// pubsub.dead_letter_subscription defaults to <topic>-dead-letter, as
// terraform names it; bigquery.dataset and table default to ontology_internal
// and events, bigquery.partitioning to ingestion_time (as terraform creates
// the table; none for an unpartitioned one). bigquery.endpoint turns
// authentication off and is for local and test servers: only a loopback
// address is accepted unless allow_remote_endpoint is true, and every process
// logs a warning at start-up for each workspace that sets one. identity is
// required where the drain runs; its algorithms default to RS256 and ES256
// (never none or HMAC); token_type, when set, is the typ header every token
// must carry; organization_claim, when set, names the claim that must hold the
// workspace's organization_id.
//
// Validation also refuses: a plain-HTTP jwks_url or endpoint on anything but a
// loopback address (127.0.0.1.nip.io is not one), one runtime_subject on two
// workspaces (one token would drain both), a password in a postgres:// URL to
// a remote host without sslmode=require, verify-ca or verify-full, connection
// settings that do not parse (a bad sslmode, port or connect_timeout: every
// database URL is parsed at start-up, and the error names the workspace and
// field), two workspaces whose ids differ only in case, a key given twice in
// one JSON object, compared as encoding/json matches keys (case and Unicode
// simple folding: "id" then "ID" is refused, the path of the second named),
// nesting deeper than 32, a key longer than 256 bytes (no field's name is:
// it is refused before it is folded or quoted, at a few times its own
// size in memory), and a registry over MaxBytes (16 MiB: room for tens
// of thousands of workspaces; the read stops there, so a wrong path such as
// /dev/zero is an error, not an out-of-memory). An error quotes at most 64
// characters of what it refuses. Nothing logs a connection string or a URL's
// userinfo: errors and job status name a database as user@host:port/database,
// never a password in the userinfo, in a password, sslpassword or sslkey
// parameter, or in the keyword/value form (TestRedactedCarriesNoSecret).
//
// A fleet's registry goes in a file: terraform writes it to Secret Manager and
// mounts it as a volume (REPLICATION_WORKSPACES_FILE), since Cloud Run allows
// 32 KB for all variables. 10,000 workspaces parse and validate in about 70 ms
// (go test -run='^$' -bench=ParseFleet -benchmem ./shared/registry/), and
// finding one by id is a map lookup.
package registry
