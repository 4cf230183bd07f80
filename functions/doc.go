// Package functions holds the replication's HTTP functions, registered with
// the functions framework: Drain, which the ontology service wakes after each
// commit (POST /api/internal/v1/workspaces/{workspace}/ontology/replication/drain
// with the workspace runtime's identity token), and Verify, which Cloud
// Scheduler calls every minute. Both are thin: they authenticate and parse
// the request, call shared/delivery and write one JSON answer and one log
// line.
//
// The handlers are built once per instance from the environment
// (REPLICATION_WORKSPACES or REPLICATION_WORKSPACES_FILE, LOG_LEVEL,
// VERIFY_TIME_BUDGET, VERIFY_SWEEP_BATCHES, PUBSUB_EMULATOR_HOST); a bad
// configuration is reported by Check, naming the field, before the server
// starts. functions/cmd is the server: the container's entry point and the
// local runner.
package functions
