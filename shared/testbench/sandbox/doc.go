// Package sandbox runs the whole replication pipeline on this machine with
// no cloud account, for the local mode (go run ./job/local) and the chaos
// proof (go run ./job/chaos): Open starts every part, each component as
// production runs it, and Close stops them. It is never deployed.
//
// What stands in for what:
//
//   - Cloud SQL with the SDK's schema: a throwaway PostgreSQL cluster (initdb
//     in a temporary directory, a free loopback port; as root the server runs
//     as the `postgres` user) with the demo ontology at protocol 4 and an
//     active generation — the same starter the tests use. With Config.CloudSQL (--cloud-sql)
//     each component reaches it as production does: the Cloud SQL Go
//     connector (IAM login, private IP) to a stand-in for the instance
//     (cloudsqlproxy: the Admin API's connect settings and
//     ephemeral certificates on loopback, and the instance's TLS server
//     proxy in front of the cluster's socket, where each component's IAM
//     database user is its role); the report's database line counts the
//     certificates and logins. With Config.Pooled (--pooled) each component reaches it
//     through a PgBouncer in session mode (pgbouncer), its
//     registry entries pooled, as a fleet's deployment does through Cloud
//     SQL's Managed Connection Pooling
//   - the ontology service waking the drain after each commit: the workload's
//     writers: each commit, then `POST …/drain` with a runtime token, 5 s,
//     body ignored, as the SDK's `service/replication.js` does
//   - the platform's runtime tokens: a local ES256 issuer and its JWKS, served
//     on loopback
//   - Cloud Run services `replication-drain` and `replication-verify`: the
//     same `Drain` and `Verify` functions served on loopback
//     (`functions.NewHandler`)
//   - Cloud Scheduler: a ticker calling `Verify` every 2 s
//   - Pub/Sub: the in-process emulator (`pstest`), with the topic, a BigQuery-style
//     subscription and the dead-letter topic and its subscription
//     (`<topic>-dead-letter`, as terraform names it); the feeder moves a
//     message it refused 5 times to the dead-letter topic itself, as a dead-letter
//     policy does (pstest's own policy cannot remove a nacked message
//     from the subscription, so a discarded dead letter would come back)
//   - the BigQuery subscription and the events table: the local warehouse: a
//     second PostgreSQL database with the columns of the SDK's
//     `REPLICATION_TABLE_SCHEMA`, fed from the subscription as
//     `use_table_schema` does (JSON fields to columns, `payload` string to a
//     JSON column, `revision` string to NUMERIC, unknown fields dropped, a
//     message that does not fit nacked until it is dead-lettered)
//   - BigQuery lookups: a BigQuery REST server (`shared/testbench/bqserver`)
//     backed by the local warehouse: the verifier runs the real BigQuery
//     client path (`jobs.query`, parameterised `IN UNNEST(@ids)`) against it
//   - the BigQuery views: PostgreSQL views rendered from the same view model
//     as the BigQuery views
//
// With Config.Chaos the drain is served by Config.Drains processes of the
// deployed entry point (functions/cmd, built at the start, on loopback),
// so that a fault can stop, kill or freeze one (DrainProcess), each
// component reaches Pub/Sub and BigQuery through a fault proxy of its own
// (faultproxy), whose observer records who published what first
// (PublishLedger), and the verifier's sweep is served apart from its
// passes that only verify.
package sandbox
