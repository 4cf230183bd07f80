// Command local runs the whole replication pipeline on this machine (see
// the README's "Try it"): go run ./job/local.
//
// # What stands in for what
//
//   - Cloud SQL with the SDK's schema: a throwaway PostgreSQL cluster (initdb
//     in a temporary directory, a free loopback port; as root the server runs
//     as the `postgres` user) with the demo ontology at protocol 4 and an
//     active generation — the same starter the tests use. With --cloud-sql
//     each component reaches it as production does: the Cloud SQL Go
//     connector (IAM login, private IP) to a stand-in for the instance
//     (shared/testbench/cloudsqlproxy: the Admin API's connect settings and
//     ephemeral certificates on loopback, and the instance's TLS server
//     proxy in front of the cluster's socket, where each component's IAM
//     database user is its role); the report's database line counts the
//     certificates and logins. With --pooled each component reaches it
//     through a PgBouncer in session mode (shared/testbench/pgbouncer), its
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
// Two things are staged: the outage (Pub/Sub refuses publishes for 300 ms)
// and the dead letter (the warehouse refuses one customer's event until
// Pub/Sub dead-letters it). The verifier sends an event back to pending only
// once it was accepted more than 15 minutes ago; so that this happens within
// the demo, the local mode moves that one event's timestamps back 16 minutes
// once it is in the dead letter — the only write it makes behind the
// product's back. The ~30 s to full verification are the verifier's
// 30-second recheck of events it looked for before they landed.
//
// # The chaos run
//
// With --chaos DURATION the same parts run a bursty SDK workload (--rate
// commits per second over --writers writers in bursts of 1–2.5 s, pauses
// of 1.5–3 s between them, each commit followed by a wake-up to one of --drains
// drain processes) for DURATION while a nemesis injects faults on a
// schedule drawn from --seed (printed, so that a run can be repeated), in
// rounds of every kind about 2 s apart, each line printed as it happens and
// saying what it met (a window that met nothing is counted apart):
//
//   - end_drain_sessions, end_verifier_sessions, end_job_sessions:
//     pg_terminate_backend of every session of one component (each reaches
//     the database as its own role, with the terraform README's GRANTs, and
//     under its own application_name)
//   - postgres_restart: the whole server stopped (fast) and started again
//   - migration: the SDK's lifecycle lock held exclusively past every
//     lock timeout, as an SDK migration holds it
//   - pubsub_refuse, pubsub_hang, pubsub_lose_response,
//     pubsub_reset_connections, pubsub_slow, pubsub_split: on the wire
//     between the product and Pub/Sub, a gRPC proxy
//     (shared/testbench/faultproxy) answers Publish UNAVAILABLE, holds it
//     unanswered and unforwarded, forwards it (the message is stored) and
//     withholds the answer, resets every connection, holds each publish
//     longer than the drain's 2 s slice, or refuses every publish of more
//     than one message (RESOURCE_EXHAUSTED: claims accepted in part)
//   - bigquery_slow, bigquery_5xx, bigquery_down_stalled: in front of the
//     BigQuery REST server, answers held past the verifier's 20 s lookup
//     time-out, 503, or 400 at once while the subscription writes nothing
//   - warehouse_stall: the BigQuery subscription (the local warehouse's
//     feeder) writes nothing for a few seconds, as a lagging subscription
//   - key_rotation: the issuer serves a new key only and signs with it (at
//     least 35 s apart: the drain refetches keys for an unknown key id at
//     most once per 30 s)
//   - drain_restart: a drain process (the deployed entry point,
//     functions/cmd, built at the start and listening on loopback) whose
//     drainers are at work gets SIGTERM, and SIGKILL 10 s later if still
//     alive, as Cloud Run stops an instance: it answers 503 from then on,
//     its drainers finish their batches out within its 8 s grace, and what
//     they left (their LogDrainLeft lines) is counted in the fault's line;
//     a new process serves on the same port
//   - drain_kill, drain_freeze: a drain process, preferably one whose
//     session holds a turn lock, gets SIGKILL, or SIGSTOP for 22 s; a new
//     process serves on the same port after a kill
//
// and the job's Service runs a whole replay at 30 % of DURATION, a partial
// replay of the customers at 50 % and a `job drain` at 70 %, each to its
// end whatever the faults, each replay with the BigQuery subscription held
// for its first 4 s. The verifier's sweep runs once a minute, as in
// production, so that it cannot hide a wake-up path that strands commits.
// At each pause of the SDK the claim race (claimRace) wakes one idle
// instance for a quick run of commits, holds at the Pub/Sub proxy the
// publish of the claim that took the last of them, and, while it is held,
// commits once more and wakes the same instance: that wake-up must not be
// coalesced into the drain that has claimed (a fault of the instance
// before the race excuses nothing of it). Every third race then loses the
// held publish (never forwarded, answered DEADLINE_EXCEEDED): its drain
// must publish those events again, never acknowledge them unpublished.
//
// Live, every second it checks, reading the delivery rows before what
// Pub/Sub stored and what landed (so that a row moving on between the
// reads is never a false alarm), that no accepted event lacks a message in
// Pub/Sub, no verified event lacks a row in the warehouse, and no receipt
// disagrees with its delivery row; and at every pause of the SDK with no
// wake-up request in flight, that every wake-up answered 2xx has its
// commit published or held by a claim (a drain instance's own kill, freeze
// or restart excuses that instance's promises, for 30 s after it, and
// another instance's made before it began: their commit may sit in its
// claim).
// Faults off, it waits for full verification and proves: the claim race
// was run; every promised
// commit published by a drain in flight; every promised commit published
// first by a wake-up's drain or an operation within 30 s of its commit, or
// by the sweep only while a wake-up request to its instance that was open
// at its answer was still in flight (a race with the drain carrying it);
// every captured event verified, with nothing pending or set
// aside; none accepted but never published; none verified before it
// landed; none lost; each replay published every event in its scope again
// after it started; every operation finished; the views equal to the
// source tables, every column; `job audit` equal. It exits 0 only if every
// proof holds; --json prints the report with the fault timeline, and
// --plot FILE.svg draws it (rates, the delivery and verification lags, the
// fault windows and the operations).
package main
