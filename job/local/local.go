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
//     certificates and logins
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
//   - drain_restart, drain_kill, drain_freeze: a drain process (the
//     deployed entry point, functions/cmd, built at the start and listening
//     on loopback), preferably one whose session holds a turn lock, gets
//     SIGTERM (its 8 s grace; SIGKILL 2–6 s later if still alive, as Cloud
//     Run does), SIGKILL, or SIGSTOP for 22 s; a new process serves on the
//     same port
//
// and the job's Service runs a whole replay at 30 % of DURATION, a partial
// replay of the customers at 50 % and a `job drain` at 70 %, each to its
// end whatever the faults, each replay with the BigQuery subscription held
// for its first 4 s. The verifier's sweep runs once a minute, as in
// production, so that it cannot hide a wake-up path that strands commits.
//
// Live, every second it checks, reading the delivery rows before what
// Pub/Sub stored and what landed (so that a row moving on between the
// reads is never a false alarm), that no accepted event lacks a message in
// Pub/Sub, no verified event lacks a row in the warehouse, and no receipt
// disagrees with its delivery row; and at every pause of the SDK with no
// wake-up request in flight, that every wake-up answered 2xx has its
// commit published or held by a claim (a drain instance's own kill, freeze
// or restart excuses only that instance's promises, for 30 s after it).
// Faults off, it waits for full verification and proves: every promised
// commit published by a drain in flight; every event published first by a
// wake-up's drain or an operation, never only by the sweep, within 30 s of
// its commit; every captured event verified, with nothing pending or set
// aside; none accepted but never published; none verified before it
// landed; none lost; each replay published every event in its scope again
// after it started; every operation finished; the views equal to the
// source tables, every column; `job audit` equal. It exits 0 only if every
// proof holds; --json prints the report with the fault timeline, and
// --plot FILE.svg draws it (rates, the delivery and verification lags, the
// fault windows and the operations).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/logging"
	"github.com/segmentstream/ontology-replication/shared/testbench/cloudsqlproxy"
	"github.com/segmentstream/ontology-replication/shared/testbench/faultproxy"
	"github.com/segmentstream/ontology-replication/shared/testbench/localwarehouse"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/testbench/tokenissuer"
)

// localConfig is the local command's flags.
type localConfig struct {
	records       int
	writers       int
	keep          bool
	json          bool
	verifyEvery   time.Duration
	verifyTimeout time.Duration
	verifyBudget  time.Duration
	chaos         chaosConfig
	// drains is how many drain instances serve the wake-ups (--chaos).
	drains int
	// cloudSQL reaches the database through the Cloud SQL connector and
	// the stand-in (--cloud-sql).
	cloudSQL bool
}

// The local deployment's fixed names.
const (
	localWorkspace    = "demo"
	localOrganization = "org-demo"
	localSubject      = "runtime-demo"
	localAudience     = "replication"
	localProject      = "local-project"
	localTopic        = "projects/" + localProject + "/topics/ontology-replication"
	localDeadTopic    = "projects/" + localProject + "/topics/ontology-replication-dead-letter"
	localSubscription = "projects/" + localProject + "/subscriptions/bigquery"
	localDeadSub      = "projects/" + localProject + "/subscriptions/ontology-replication-dead-letter"
	// localMaxDeliveries is the BigQuery subscription's dead-letter policy.
	localMaxDeliveries = 5
)

// local is one local run: every part, started and stopped together.
type local struct {
	cfg      localConfig
	log      *slog.Logger
	logLevel string
	out      io.Writer
	cleanup  []func()

	cluster  *pgtest.Cluster
	ontology *pgxpool.Pool
	gen      sdkfixture.Generation
	writer   *sdkfixture.Writer
	pubsub   *pstest.Server
	client   *pubsub.Client
	faults   *faultSwitch
	// pubsubProxies are each component's way to Pub/Sub, bigqueryFaults
	// the product's way to BigQuery: where the chaos run puts its wire
	// faults. published is what the proxies saw published, by whom.
	pubsubProxies  map[string]*faultproxy.GRPC
	published      *publishLedger
	bigqueryFaults *faultproxy.HTTP
	// cloudSQL is the Cloud SQL stand-in (--cloud-sql).
	cloudSQL *cloudsqlproxy.Instance
	// drainProcs are the chaos run's drain instances.
	drainProcs []*drainProcess
	// logs receives the drain process's lines (with LOG_LEVEL set).
	logs     io.Writer
	wh       *localwarehouse.Local
	feeder   *localwarehouse.Feeder
	issuer   *tokenissuer.Issuer
	urls     localURLs
	registry string
	// svc is the job's Service over this run's parts (the final audit).
	svc       *delivery.Opened
	deadCount atomic.Int64
	commits   atomic.Int64
	progress  *progress
	// agedDeadLetter is set once the dead-lettered event's acceptance was
	// moved back (the lags stop counting then).
	agedDeadLetter atomic.Bool
	// deadHistory is the history id of the event sent to the dead letter.
	deadHistory atomic.Pointer[string]
}

type localURLs struct {
	verify, sweep, jwks, bigquery, ontologyDB, warehouseDB string
	// drains are the drain's URLs, one per instance.
	drains []string
	// roles are each component's database URL, as its role.
	roles map[string]string
}

func (l *local) close() {
	for i := len(l.cleanup) - 1; i >= 0; i-- {
		l.cleanup[i]()
	}
}

// faultSwitch makes Pub/Sub's Publish fail while on: the injected outage.
type faultSwitch struct {
	on      atomic.Bool
	refused atomic.Int64 // publishes refused so far
}

// React implements pstest.Reactor: it fails Publish while the switch is on.
func (f *faultSwitch) React(any) (bool, any, error) {
	if f.on.Load() {
		f.refused.Add(1)
		return true, nil, status.Error(codes.Unavailable, "injected Pub/Sub outage")
	}
	return false, nil, nil
}

// parseLocalFlags reads the local command's flags; -h prints them.
func parseLocalFlags(args []string, stdout io.Writer) (localConfig, error) {
	fs := flag.NewFlagSet("local", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var cfg localConfig
	fs.IntVar(&cfg.records, "records", 3000, "how many changes the workload commits")
	fs.IntVar(&cfg.writers, "writers", 4, "concurrent writers (16 with --chaos)")
	fs.BoolVar(&cfg.keep, "keep", false, "keep everything running after the summary, until Ctrl-C")
	fs.BoolVar(&cfg.json, "json", false, "print the summary as JSON")
	fs.DurationVar(&cfg.verifyEvery, "verify-every", 2*time.Second, "how often the verifier runs")
	fs.DurationVar(&cfg.verifyTimeout, "timeout", 3*time.Minute, "how long to wait for full verification after the workload")
	fs.DurationVar(&cfg.chaos.duration, "chaos", 0, "run the SDK workload for this long under injected faults, then prove nothing was lost (at least 45s)")
	fs.Uint64Var(&cfg.chaos.seed, "seed", 0, "with --chaos: the fault schedule's seed (default: from the clock, printed)")
	fs.Float64Var(&cfg.chaos.rate, "rate", 40, "with --chaos: SDK commits per second while the SDK is busy, over all writers")
	fs.StringVar(&cfg.chaos.plot, "plot", "", "with --chaos: write the run's timeline to this file, as SVG")
	fs.IntVar(&cfg.drains, "drains", 2, "with --chaos: drain instances (processes of the deployed entry point), 1 to 8")
	fs.BoolVar(&cfg.cloudSQL, "cloud-sql", false, "every component reaches the database as production does: through the Cloud SQL Go connector, IAM login, private IP, to a local Cloud SQL stand-in in front of PostgreSQL")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, "usage: go run ./job/local [flags]\n\nthe whole pipeline on this machine: PostgreSQL, Pub/Sub, a local warehouse, the functions and a workload\n\nflags:")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return cfg, err
		}
		return cfg, usageError{fmt.Errorf("local: %w (go run ./job/local -h lists the flags)", err)}
	}
	if fs.NArg() > 0 {
		return cfg, usageError{fmt.Errorf("local: unexpected argument %q (go run ./job/local -h lists the flags)", fs.Arg(0))}
	}
	if cfg.records < 20 || cfg.writers < 1 || cfg.writers > 32 {
		return cfg, usageError{errors.New("local: --records must be at least 20 and --writers between 1 and 32")}
	}
	cfg.verifyBudget = 10 * time.Second
	if cfg.cloudSQL && (cfg.chaos.duration != 0 || cfg.keep) {
		// The chaos run's drains are processes of the deployed entry
		// point, and --keep's job commands others again: those reach Cloud
		// SQL only with Google's Admin API and credentials.
		return cfg, usageError{errors.New("local: --cloud-sql runs every component in this process: it goes without --chaos and --keep")}
	}
	if cfg.chaos.plot != "" && cfg.chaos.duration == 0 {
		return cfg, usageError{errors.New("local: --plot draws a chaos run: it needs --chaos")}
	}
	if cfg.chaos.duration != 0 {
		writersSet := false
		fs.Visit(func(f *flag.Flag) { writersSet = writersSet || f.Name == "writers" })
		if !writersSet {
			cfg.writers = 16 // the SDK's writers wait for each wake-up's answer
		}
		if cfg.chaos.duration < minChaos || cfg.keep || cfg.chaos.rate < 1 || cfg.chaos.rate > 500 || cfg.drains < 1 || cfg.drains > 8 {
			return cfg, usageError{errors.New("local: --chaos must be at least 45s, without --keep, with --rate between 1 and 500 and --drains between 1 and 8")}
		}
		if cfg.chaos.seed == 0 {
			cfg.chaos.seed = uint64(time.Now().UnixNano()%1_000_000) + 1
		}
		// A slow BigQuery answer then meets the lookup's own 20 s time-out
		// before the pass's budget.
		cfg.verifyBudget = 30 * time.Second
	}
	return cfg, nil
}

// runLocal starts every part, runs the workload, prints the summary and,
// with --keep, serves the sandbox until ctx ends.
func runLocal(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseLocalFlags(args, stdout)
	if err != nil {
		return err
	}
	// Quiet by default: the summary says what happened (the injected outage
	// alone makes a hundred 503s). LOG_LEVEL=INFO shows every invocation.
	level := slog.LevelError + 4
	if raw := getenv("LOG_LEVEL"); raw != "" {
		var err error
		if level, err = logging.ParseLevel(raw); err != nil {
			return fmt.Errorf("local: LOG_LEVEL: %w", err)
		}
	}
	l := &local{cfg: cfg, log: logging.New(stderr, logging.Config{Level: level}), out: stdout, logLevel: level.String(), logs: io.Discard}
	if getenv("LOG_LEVEL") != "" {
		l.logs = stderr
	}
	defer l.close()
	l.progress = newProgress(stderr, l)
	l.progress.commits = l.commits.Load
	l.progress.enter("starting PostgreSQL, Pub/Sub, the local warehouse and the functions", "")
	if err := l.start(ctx); err != nil {
		return fmt.Errorf("local: %w", err)
	}
	progressCtx, stopProgress := context.WithCancel(ctx)
	progressDone := make(chan struct{})
	go func() { defer close(progressDone); l.progress.run(progressCtx) }()
	if cfg.chaos.duration != 0 {
		rep, err := l.runChaos(ctx)
		stopProgress()
		<-progressDone
		if err != nil {
			return fmt.Errorf("local: chaos: %w", err)
		}
		if err := rep.print(stdout, cfg.json); err != nil {
			return err
		}
		return rep.failure()
	}
	sum, err := l.runWorkload(ctx)
	stopProgress()
	<-progressDone
	if err != nil {
		return fmt.Errorf("local: %w", err)
	}
	pendingLag, verifyLag := l.progress.lags()
	sum.MaxDeliveryLagSecs, sum.MaxVerificationLagSecs = pendingLag.Seconds(), verifyLag.Seconds()
	sum.Database, sum.databaseProblem = l.databasePath(), l.cloudSQLProblem()
	l.progress.enter("done", "")
	if l.progress.terminal {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if err := sum.print(stdout, cfg.json); err != nil {
		return err
	}
	if cfg.keep {
		l.keepServing(ctx)
	}
	return sum.failure()
}

// keepServing keeps the sandbox working until ctx ends: the warehouse is
// fed from the subscription and the verifier runs on its schedule, so that
// what the job's commands publish (a repair, a replay) lands and is
// verified.
func (l *local) keepServing(ctx context.Context) {
	l.printKeep(l.out)
	go func() { _ = l.feeder.Run(ctx) }()
	go every(ctx, l.cfg.verifyEvery, func() { l.callVerify(ctx) })
	<-ctx.Done()
	fmt.Fprintln(l.out, "stopping and cleaning up")
}

// wake calls the drain at url as the ontology service does after a
// commit: POST with the runtime token and organisation, 5 s, body ignored,
// a non-2xx only logged (the SDK logs it as deferred).
func (l *local) wake(ctx context.Context, url, token string) int {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return l.post(ctx, url, token)
}

// post sends a wake-up to url and returns its status (0: no answer).
func (l *local) post(ctx context.Context, url, token string) int {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	req.Header.Set("x-segmentstream-runtime-identity", token)
	req.Header.Set("x-segmentstream-organization-id", localOrganization)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		l.log.Warn("ontology.replication.deferred", slog.Any("error", err))
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		l.log.Info("ontology.replication.deferred", slog.Int("status", resp.StatusCode))
	}
	return resp.StatusCode
}

func (l *local) printKeep(w io.Writer) {
	token, _ := l.issuer.Token(localSubject, localAudience, 24*time.Hour)
	fmt.Fprintf(w, `
Everything keeps running until Ctrl-C:
  ontology database   psql '%s'
  warehouse database  psql '%s'   (table events, views customer, product, order, order_products)
  drain               curl -X POST -H 'x-segmentstream-runtime-identity: %s' -H 'x-segmentstream-organization-id: %s' %s
  verifier            curl -X POST %s
  BigQuery (REST)     %s
  Pub/Sub emulator    PUBSUB_EMULATOR_HOST=%s
  registry            REPLICATION_WORKSPACES='%s'

The job's commands run against these parts (no Google credentials needed) after:
  export REPLICATION_WORKSPACES='%[9]s' PUBSUB_EMULATOR_HOST=%[8]s
for example:
  go run ./job status                      # counts, lags, set-aside events, dead letters
  go run ./job dead-letter                 # the demo's dead-lettered event
  go run ./job dead-letter --discard       # remove it (it was retried and verified)
  go run ./job replay --entity customer    # send the customers back; they land again
  go run ./job audit                       # the warehouse against the source: exit 0 when equal
`, l.urls.ontologyDB, l.urls.warehouseDB, token, localOrganization, l.urls.drains[0], l.urls.verify, l.urls.bigquery, l.pubsub.Addr, compact(l.registry))
}

// every calls fn every d until ctx ends, one call at a time.
func every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

func compact(s string) string {
	out := make([]byte, 0, len(s))
	space := false
	for _, c := range []byte(s) {
		if c == '\n' || c == ' ' {
			if !space {
				out = append(out, ' ')
			}
			space = true
			continue
		}
		space = false
		out = append(out, c)
	}
	return string(out)
}
