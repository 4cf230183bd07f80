// Command chaos proves the wake-up path's promise under faults: it runs the
// SDK's workload on the sandbox's local parts (go doc
// ./shared/testbench/sandbox) while a nemesis injects faults, then checks
// every promise the drain made, and exits 0 only if each proof holds.
//
//	go run ./job/chaos [--duration 60s] [--seed N] [--rate 40] [--drains 2] [--plot FILE.svg] [--json] [--pooled]
//
// It lives apart from the product it tests, as Jepsen does, and its rules
// come from the contract (SPEC §3), not from the product's documentation:
// whatever the product cannot keep, the product must change or the SPEC
// must say.
//
// # The workload and the faults
//
// A bursty SDK workload (--rate commits per second over --writers writers
// in bursts of 1–2.5 s, pauses of 1.5–3 s between them), each commit
// followed by a wake-up to one of --drains drain processes (the deployed
// entry point, functions/cmd, built at the start), runs for --duration
// while a nemesis injects faults on a schedule drawn from --seed (printed,
// so that a run can be repeated), every kind once in each round of about
// 50 s, each line printed as it happens and saying what it met (a fault
// that met nothing is tried again, then counted apart):
//
//   - end_drain_sessions, end_verifier_sessions, end_job_sessions:
//     pg_terminate_backend of every session of one component (each reaches
//     the database as its own role, with the terraform README's GRANTs, and
//     under its own application_name)
//   - postgres_restart: the whole server stopped (fast) and started again
//   - migration: the SDK's lifecycle lock held exclusively past every
//     lock timeout, as an SDK migration holds it
//   - pubsub_refuse, pubsub_hang, pubsub_lose_response,
//     pubsub_reset_connections, pubsub_slow, pubsub_split,
//     pubsub_invalid_argument: on the wire between the product and
//     Pub/Sub, a gRPC proxy (shared/testbench/faultproxy) answers Publish
//     UNAVAILABLE, holds it unanswered and unforwarded, forwards it (the
//     message is stored) and withholds the answer, resets every
//     connection, holds each publish longer than the drain's 2 s slice,
//     refuses every publish of more than one message (RESOURCE_EXHAUSTED:
//     claims accepted in part), or refuses every publish's content
//     (INVALID_ARGUMENT: the drain sets aside what fails alone, and the
//     run then retries it as an operator does, job set-aside --retry)
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
// and the job's Service runs a whole replay at 30 % of the duration, a
// partial replay of the customers at 50 % and a `job drain` at 70 %, each
// to its end whatever the faults, each replay with the BigQuery
// subscription held for its first 4 s. The verifier's sweep runs once a
// minute, as in production, so that it cannot hide a wake-up path that
// strands commits. At each pause of the SDK the claim race wakes one idle
// instance for a quick run of commits, holds at the Pub/Sub proxy the
// publish of the claim that took the last of them, and, while it is held,
// commits once more and wakes the same instance: that wake-up must not be
// coalesced into the drain that has claimed. Every third race loses the
// held publish (never forwarded, answered DEADLINE_EXCEEDED): its drain
// must publish those events again, never acknowledge them unpublished.
//
// # The proofs
//
// SPEC §3: "A wake-up answered 2xx is a promise: its commit is published
// by a drain that is alive, never left to a later wake-up or the
// verifier's sweep, whatever that drain meets." So a broken promise is
// excused only when the process that made it was killed, frozen, or
// stopped by the platform with work left (its own LogDrainLeft line) after
// its answer: nothing in a process's memory outlives that. Nothing else
// excuses one — not another instance's fault, not a fault's aftermath, not
// Pub/Sub, BigQuery or the database. Excused promises are reported as a
// share of those judged.
//
// Live, every second, it reads the delivery rows before what Pub/Sub
// stored and what landed (so that a row moving on between the reads is
// never a false alarm) and checks that no accepted event lacks a message,
// no verified event lacks a row in the warehouse, and no receipt disagrees
// with its delivery row. At every pause of the SDK with no wake-up request
// in flight and no drainer running, every commit whose wake-up was
// answered 2xx must be published, or held by a claim (an operation's, the
// sweep's) or set aside; one that is not is stranded.
//
// Faults off, it waits for full verification and proves: the claim race
// was run and lost what it said; no promised commit stranded; each promise
// covered by the drainer run its answer named (the answer names its run
// and the wake-up's place, the run's last line which wake-ups its last
// claim came after), so that a publish is credited only to the drain the
// promise was made on; no promised commit published first by the sweep
// once every drain that could carry it had ended; every captured event
// verified, none pending or set aside; none accepted but never published;
// none verified before it landed; none lost; each replay published every
// event in its scope again after it started; every operation finished;
// every fault it reported injected (counted by the part that took it: a
// proxy, the issuer, the kernel, the server); the views equal to the source
// tables, every column; `job audit` equal. How late promised commits were
// published (commit to first publish) is reported as a figure: the SPEC
// bounds no delivery under faults.
//
// --json prints the report with the fault timeline, and --plot FILE.svg
// draws it: rates and lags, the fault windows in a lane a kind and shaded
// behind every panel, the operations.
//
// It is never deployed, and the deployed binaries link none of it.
package main
