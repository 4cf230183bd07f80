package main

import (
	"context"
	"encoding/json"
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

	"github.com/segmentstream/ontology-replication/shared/cliflags"
	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/logging"
	"github.com/segmentstream/ontology-replication/shared/testbench/cloudsqlproxy"
	"github.com/segmentstream/ontology-replication/shared/testbench/faultproxy"
	"github.com/segmentstream/ontology-replication/shared/testbench/localwarehouse"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgbouncer"
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
	// pooled reaches it through a PgBouncer in session mode (--pooled).
	pooled bool
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
	// pooler is the PgBouncer in front of the database (--pooled).
	pooler *pgbouncer.Server
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
	fs.BoolVar(&cfg.pooled, "pooled", false, "every component reaches the database through a PgBouncer in session mode, as a fleet's deployment does through a pooler (registry database.pooled)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, "usage: go run ./job/local [flags]\n\nthe whole pipeline on this machine: PostgreSQL, Pub/Sub, a local warehouse, the functions and a workload\n\nflags:\n"+
				cliflags.Usage(fs))
			return cfg, err
		}
		return cfg, usageError{fmt.Errorf("local: %s (go run ./job/local -h lists the flags)", cliflags.Dashes(err.Error()))}
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
	if cfg.pooled && cfg.cloudSQL {
		return cfg, usageError{errors.New("local: --pooled and --cloud-sql are two ways to the database: choose one")}
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
	return l.post(ctx, url, token).status
}

// wakeAnswer is a wake-up's answer: its status (0: none), and whether it
// started the instance's drainer (a 2xx that was not coalesced).
type wakeAnswer struct {
	status  int
	started bool
	// run and wake are the answer's drainer run and the wake-up's place
	// (delivery.WakeAnswer).
	run, wake uint64
}

// post sends a wake-up to url and returns its answer.
func (l *local) post(ctx context.Context, url, token string) wakeAnswer {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	req.Header.Set("x-segmentstream-runtime-identity", token)
	req.Header.Set("x-segmentstream-organization-id", localOrganization)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		l.log.Warn("ontology.replication.deferred", slog.Any("error", err))
		return wakeAnswer{}
	}
	var body struct {
		Promised, Coalesced bool
		Run, Wake           uint64
	}
	_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&body)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		l.log.Info("ontology.replication.deferred", slog.Int("status", resp.StatusCode))
	}
	return wakeAnswer{status: resp.StatusCode, started: resp.StatusCode/100 == 2 && body.Promised && !body.Coalesced, run: body.Run, wake: body.Wake}
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
