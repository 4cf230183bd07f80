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
// true} instead of url.
package registry
