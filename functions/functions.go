package functions

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"time"

	"cloud.google.com/go/cloudsqlconn"
	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"
	"github.com/GoogleCloudPlatform/functions-framework-go/functions"

	"github.com/segmentstream/ontology-replication/shared/config"
	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/identity"
	"github.com/segmentstream/ontology-replication/shared/logging"
)

// Environment variables the functions read besides the shared ones
// (config.EnvNames: the registry, LOG_LEVEL, PUBSUB_EMULATOR_HOST,
// DATABASE_POOL_SIZE).
const (
	// EnvVerifyBudget is the verifier's time budget per run, shared by the
	// workspaces it verifies, a Go duration. Default: 50s.
	EnvVerifyBudget = "VERIFY_TIME_BUDGET"
	// EnvSweepBatches is how many pending batches the verifier's sweep
	// publishes per workspace per run. Default: 20.
	EnvSweepBatches = "VERIFY_SWEEP_BATCHES"
	// EnvVerifyWorkers is how many workspaces the verifier verifies at
	// once. Default: 16.
	EnvVerifyWorkers = "VERIFY_WORKERS"
	// EnvDrainGather is how long a busy workspace's drainer waits on the
	// next turn before its claim, gathering the commits of the wake-ups
	// that come meanwhile, a Go duration from 0 (off) to 1s. Default:
	// delivery.DefaultGather (85ms).
	EnvDrainGather = "DRAIN_GATHER"
	// EnvDrainQuietInterval is the mean time between one instance's
	// wake-ups of a workspace at and above which the workspace is quiet and
	// its drainer claims at once instead of taking turns, a Go duration up
	// to 1m; 0 makes every claim take turns. Default:
	// delivery.DefaultQuietInterval (100ms).
	EnvDrainQuietInterval = "DRAIN_QUIET_INTERVAL"
	// EnvDrainBatchesOut is how many batches a drainer has out at once, a
	// whole number from 1 to 64. Default: delivery.DefaultBatchesOut (4).
	EnvDrainBatchesOut = "DRAIN_BATCHES_OUT"
)

// FunctionNames are the functions this package registers, the values
// FUNCTION_TARGET may take.
var FunctionNames = []string{"Drain", "Verify"}

// Env lists every environment variable the functions read.
var Env = append(slices.Clone(config.EnvNames), EnvVerifyBudget, EnvSweepBatches, EnvVerifyWorkers, EnvDrainGather, EnvDrainQuietInterval, EnvDrainBatchesOut,
	EnvVerifyCaller, EnvVerifyAudience, EnvVerifyCallerCheck, "K_SERVICE")

// defaultMaxOpenPools bounds the workspace pools an instance keeps open:
// with defaultPoolSize, at most 128 connections an instance holds across
// the fleet (one per open pool, mostly, and each closed after 30 s idle).
const defaultMaxOpenPools = 64

// drainersCloseWait bounds how long a server's close waits for its
// drainers to publish and acknowledge their batches out (Serve's stop waits
// within its own grace first).
const drainersCloseWait = 10 * time.Second

// defaultPoolSize is each instance's connections per workspace database:
// a drainer holds one while it runs.
const defaultPoolSize = 2

// app is the functions' one instance, built from the environment when the
// package is loaded, as the functions framework requires registration in
// init. A configuration error is kept and reported by Check and by every
// request, never as a nil dereference.
var app *server

func init() {
	app = newServerFromEnv()
	functions.HTTP("Drain", serveDrain)
	functions.HTTP("Verify", serveVerify)
	// Without FUNCTION_TARGET (the local runner) the framework serves each
	// function only at /<Name>; the drain's own path is served too, so the
	// local runner answers the URL the SDK calls.
	if err := funcframework.RegisterHTTPFunctionContext(context.Background(), drainPrefix, serveDrain); err != nil {
		panic(fmt.Sprintf("functions: register %s: %v", drainPrefix, err))
	}
}

func serveDrain(w http.ResponseWriter, r *http.Request)  { app.serveDrain(w, r) }
func serveVerify(w http.ResponseWriter, r *http.Request) { app.serveVerify(w, r) }

// LocalOptions are what a local server of the functions replaces.
type LocalOptions struct {
	// Publisher replaces the Pub/Sub publisher (nil: one built from the
	// environment).
	Publisher delivery.Publisher
	// Logger receives the functions' logs (nil: JSON on stdout).
	Logger *slog.Logger
	// DialerOptions are extra Cloud SQL connector options for the
	// workspaces on Cloud SQL (the local mode's --cloud-sql: its stand-in's
	// Admin API, dial and tokens); see database.Config.
	DialerOptions []cloudsqlconn.Option
}

// Local is a local server of the functions (NewHandler): the local mode
// and tests serve it.
type Local struct {
	// Handler serves Drain at the SDK's drain path and Verify at /Verify.
	Handler http.Handler
	svc     *delivery.Service
	close   func()
}

// Idle waits until the drainers have carried out every wake-up answered
// so far (delivery.Service.Idle), or ctx ends.
func (l *Local) Idle(ctx context.Context) error { return l.svc.Idle(ctx) }

// Close stops the drainers, their batches out published and acknowledged
// (within 10 s), and releases the pools and clients.
func (l *Local) Close() { l.close() }

// NewHandler builds the functions from getenv, apart from the process's
// environment and the functions framework, as one handler: Drain at the
// SDK's drain path, Verify at /Verify. The local mode serves it.
func NewHandler(ctx context.Context, getenv func(string) string, opts LocalOptions) (*Local, error) {
	deps := dependencies{publisher: opts.Publisher, logger: opts.Logger}
	if opts.DialerOptions != nil {
		deps.opening = func(c *delivery.OpenConfig) { c.Pools.DialerOptions = opts.DialerOptions }
	}
	s, err := newServer(ctx, getenv, deps)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/Verify", s.serveVerify)
	mux.HandleFunc(drainPrefix, s.serveDrain)
	return &Local{Handler: mux, svc: s.svc, close: s.close}, nil
}

// Check reports a configuration error, naming the field, so that the server
// can refuse to start rather than answer every request with an error. The
// target is the function to be served (FUNCTION_TARGET; empty for all).
func Check(target string) error {
	if app.err != nil {
		return app.err
	}
	if (target == "" || target == "Drain") && app.verifier == nil {
		return errors.New("functions: the drain needs the registry's identity (issuer, audience, jwks_url) to verify runtime tokens")
	}
	if (target == "" || target == "Verify") && app.callerErr != nil {
		return app.callerErr
	}
	switch target {
	case "", "Drain", "Verify":
		return nil
	}
	return fmt.Errorf("functions: FUNCTION_TARGET %q: want Drain or Verify", target)
}

// dependencies are what the server is built from besides its environment;
// tests fill them in, the zero value means production defaults.
type dependencies struct {
	publisher delivery.Publisher
	// opening adjusts what the delivery service is opened with (tests: a
	// warehouse client with their own lookup time-out).
	opening  func(*delivery.OpenConfig)
	identity identity.Config // HTTPClient and timing overrides
	logger   *slog.Logger
	// googleKeys fetches the keys of Google's OIDC tokens for the
	// verifier's caller check (nil: a default client).
	googleKeys *http.Client
}

// server holds the functions' state, shared by every request of an instance.
type server struct {
	err      error
	log      *slog.Logger
	svc      *delivery.Service
	verifier *identity.Verifier // nil when the registry has no identity
	// caller checks the verifier's caller; nil when the check is off
	// (VERIFY_CALLER_CHECK=off) or misconfigured (callerErr).
	caller        *callerCheck
	callerErr     error
	verifyBudget  time.Duration
	sweepBatches  int
	verifyWorkers int
	// refused samples the log lines of refused requests.
	refused refusals
	// close releases the server's pools and clients (tests; a deployed
	// instance keeps them until it ends).
	close func()
}

func newServerFromEnv() *server {
	s, err := newServer(context.Background(), os.Getenv, dependencies{})
	if err != nil {
		return &server{err: err, log: logging.New(os.Stdout, logging.Config{Level: slog.LevelInfo, Service: os.Getenv("K_SERVICE")})}
	}
	return s
}

// tuning is the functions' own settings from the environment: the
// verifier's budget, sweep and workers, the drain's gather, quiet interval
// and batches out.
type tuning struct {
	verifyBudget                time.Duration
	sweepBatches, verifyWorkers int
	gather, quiet               time.Duration
	batchesOut                  int
}

// readTuning reads the tuning, each variable checked against its range.
func readTuning(getenv func(string) string) (tuning, error) {
	t := tuning{verifyBudget: delivery.DefaultVerifyBudget, sweepBatches: delivery.DefaultSweepBatches, verifyWorkers: delivery.DefaultVerifyWorkers,
		gather: delivery.DefaultGather, quiet: delivery.DefaultQuietInterval}
	if raw := getenv(EnvVerifyBudget); raw != "" {
		d, err := time.ParseDuration(raw)
		if err != nil || d < time.Second || d > time.Hour {
			return t, fmt.Errorf("functions: %s: %q must be a duration between 1s and 1h", EnvVerifyBudget, raw)
		}
		t.verifyBudget = d
	}
	if raw := getenv(EnvSweepBatches); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 0 || n > 1000 {
			return t, fmt.Errorf("functions: %s: %q must be a whole number from 0 to 1000", EnvSweepBatches, raw)
		}
		t.sweepBatches = n
	}
	if raw := getenv(EnvVerifyWorkers); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > 64 {
			return t, fmt.Errorf("functions: %s: %q must be a whole number from 1 to 64", EnvVerifyWorkers, raw)
		}
		t.verifyWorkers = n
	}
	if raw := getenv(EnvDrainGather); raw != "" {
		d, err := time.ParseDuration(raw)
		if err != nil || d < 0 || d > time.Second {
			return t, fmt.Errorf("functions: %s: %q must be a duration from 0 (off) to 1s", EnvDrainGather, raw)
		}
		if t.gather = d; d == 0 {
			t.gather = -1 // off
		}
	}
	if raw := getenv(EnvDrainBatchesOut); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > 64 {
			return t, fmt.Errorf("functions: %s: %q must be a whole number from 1 to 64", EnvDrainBatchesOut, raw)
		}
		t.batchesOut = n
	}
	if raw := getenv(EnvDrainQuietInterval); raw != "" {
		d, err := time.ParseDuration(raw)
		if err != nil || d < 0 || d > time.Minute {
			return t, fmt.Errorf("functions: %s: %q must be a duration from 0 (never quiet) to 1m", EnvDrainQuietInterval, raw)
		}
		if t.quiet = d; d == 0 {
			t.quiet = -1 // never quiet
		}
	}
	return t, nil
}

// newServer builds the server of both functions from the environment and
// deps: the settings, the token checks and the delivery service.
func newServer(ctx context.Context, getenv func(string) string, deps dependencies) (*server, error) {
	t, err := readTuning(getenv)
	if err != nil {
		return nil, err
	}
	s := &server{verifyBudget: t.verifyBudget, sweepBatches: t.sweepBatches, verifyWorkers: t.verifyWorkers}
	settings, err := config.Read(getenv, defaultPoolSize)
	if err != nil {
		return nil, fmt.Errorf("functions: %w", err)
	}
	log := deps.logger
	if log == nil {
		log = logging.New(os.Stdout, logging.Config{Level: settings.LogLevel, ProjectID: settings.ProjectID, Service: getenv("K_SERVICE")})
	}
	s.log = log
	reg := settings.Registry
	if reg.Identity.Configured() {
		cfg := deps.identity
		cfg.Identity = reg.Identity
		cfg.Logger = cmp.Or(cfg.Logger, log)
		if s.verifier, err = identity.New(cfg); err != nil {
			return nil, err
		}
	}
	// The drain's service has no use for the verifier's caller settings:
	// an error here is kept for Check("Verify") and the verifier's
	// requests.
	s.caller, s.callerErr = newCallerCheck(ctx, getenv, deps.googleKeys)
	if s.caller == nil && s.callerErr == nil {
		log.WarnContext(ctx, "replication: the verifier checks no caller token ("+EnvVerifyCallerCheck+"=off): right for a local or test run only")
	}
	open := delivery.OpenConfig{
		Registry:           reg,
		PubSubEmulatorHost: settings.EmulatorHost,
		Pools:              database.Config{MaxConns: settings.PoolSize, MaxOpen: cmp.Or(settings.MaxOpenPools, defaultMaxOpenPools), ServerMaxConns: settings.ServerMaxConns},
		Publisher:          deps.publisher,
		Logger:             log,
		Gather:             t.gather,
		QuietInterval:      t.quiet,
		BatchesOut:         t.batchesOut,
	}
	if deps.opening != nil {
		deps.opening(&open)
	}
	opened, err := delivery.Open(ctx, open)
	if err != nil {
		return nil, err
	}
	s.svc = opened.Service
	report, stopReport := context.WithCancel(context.WithoutCancel(ctx))
	go s.svc.ReportConnections(report, delivery.ConnectionsInterval)
	s.close = func() {
		stopReport()
		// The drainers end before the pools and clients they use close.
		ctx, cancel := context.WithTimeout(context.Background(), drainersCloseWait)
		defer cancel()
		_ = opened.Service.Shutdown(ctx)
		opened.Close()
	}
	return s, nil
}
