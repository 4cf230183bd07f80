package functions

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"
	"github.com/GoogleCloudPlatform/functions-framework-go/functions"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/identity"
	"github.com/segmentstream/ontology-replication/shared/logging"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/warehouse"
)

// Environment variables the functions read (besides the registry's
// REPLICATION_WORKSPACES or REPLICATION_WORKSPACES_FILE, and
// PUBSUB_EMULATOR_HOST for a Pub/Sub emulator).
const (
	// EnvLogLevel is the log level: DEBUG, INFO (default), WARN or ERROR.
	EnvLogLevel = "LOG_LEVEL"
	// EnvVerifyBudget is the verifier's time budget per run, a Go duration.
	// Default: 50s.
	EnvVerifyBudget = "VERIFY_TIME_BUDGET"
	// EnvSweepBatches is how many pending batches the verifier's sweep
	// publishes per workspace per run. Default: 20.
	EnvSweepBatches = "VERIFY_SWEEP_BATCHES"
)

// Targets are the functions this package registers, the values
// FUNCTION_TARGET may take.
var Targets = []string{"Drain", "Verify"}

// Env lists every environment variable the functions read.
var Env = []string{registry.EnvInline, registry.EnvFile, delivery.EnvEmulatorHost, EnvLogLevel, EnvVerifyBudget, EnvSweepBatches}

// app is the functions' one instance, built from the environment when the
// package is loaded, as the functions framework requires registration in
// init. A configuration error is kept and reported by Check and by every
// request, never as a nil dereference. Configure replaces it (the local
// mode serves the functions with a registry of its own).
var app atomic.Pointer[server]

func init() {
	app.Store(newServerFromEnv())
	functions.HTTP("Drain", serveDrain)
	functions.HTTP("Verify", serveVerify)
	// Without FUNCTION_TARGET (the local runner) the framework serves each
	// function only at /<Name>; the drain's own path is served too, so the
	// local runner answers the URL the SDK calls.
	if err := funcframework.RegisterHTTPFunctionContext(context.Background(), drainPrefix, serveDrain); err != nil {
		panic(fmt.Sprintf("functions: register %s: %v", drainPrefix, err))
	}
}

func serveDrain(w http.ResponseWriter, r *http.Request)  { app.Load().serveDrain(w, r) }
func serveVerify(w http.ResponseWriter, r *http.Request) { app.Load().serveVerify(w, r) }

// Configure rebuilds the functions from getenv instead of the process
// environment, with the publisher and logger given (nil: the production
// ones). The local mode calls it before serving the functions.
func Configure(ctx context.Context, getenv func(string) string, publisher delivery.Publisher, log *slog.Logger) error {
	s, err := newServer(ctx, getenv, dependencies{publisher: publisher, logger: log})
	if err != nil {
		return err
	}
	app.Store(s)
	return nil
}

// Check reports a configuration error, naming the field, so that the server
// can refuse to start rather than answer every request with an error. The
// target is the function to be served (FUNCTION_TARGET; empty for all).
func Check(target string) error {
	app := app.Load()
	if app.err != nil {
		return app.err
	}
	if (target == "" || target == "Drain") && app.verifier == nil {
		return errors.New("functions: the drain needs the registry's identity (issuer, audience, jwks_url) to verify runtime tokens")
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
	warehouse *warehouse.BigQuery
	identity  identity.Config // HTTPClient and timing overrides
	logger    *slog.Logger
}

// server holds the functions' state, shared by every request of an instance.
type server struct {
	err          error
	log          *slog.Logger
	svc          *delivery.Service
	verifier     *identity.Verifier // nil when the registry has no identity
	verifyBudget time.Duration
	sweepBatches int
	// close releases the server's pools and clients (tests; a deployed
	// instance keeps them until it ends).
	close func()
}

func newServerFromEnv() *server {
	s, err := newServer(context.Background(), os.Getenv, dependencies{})
	if err != nil {
		return &server{err: err, log: logging.New(os.Stdout, slog.LevelInfo)}
	}
	return s
}

func newServer(ctx context.Context, getenv func(string) string, deps dependencies) (*server, error) {
	level := slog.LevelInfo
	if raw := getenv(EnvLogLevel); raw != "" {
		if err := level.UnmarshalText([]byte(raw)); err != nil {
			return nil, fmt.Errorf("functions: %s: %q is not a log level (DEBUG, INFO, WARN, ERROR)", EnvLogLevel, raw)
		}
	}
	log := deps.logger
	if log == nil {
		log = logging.New(os.Stdout, level)
	}
	s := &server{log: log, verifyBudget: 50 * time.Second, sweepBatches: 20}
	if raw := getenv(EnvVerifyBudget); raw != "" {
		d, err := time.ParseDuration(raw)
		if err != nil || d < time.Second || d > time.Hour {
			return nil, fmt.Errorf("functions: %s: %q must be a duration between 1s and 1h", EnvVerifyBudget, raw)
		}
		s.verifyBudget = d
	}
	if raw := getenv(EnvSweepBatches); raw != "" {
		var n int
		if _, err := fmt.Sscanf(raw, "%d", &n); err != nil || n < 0 || n > 1000 || fmt.Sprint(n) != strings.TrimSpace(raw) {
			return nil, fmt.Errorf("functions: %s: %q must be a whole number from 0 to 1000", EnvSweepBatches, raw)
		}
		s.sweepBatches = n
	}
	reg, err := registry.Load(getenv)
	if err != nil {
		return nil, err
	}
	if reg.Identity.Configured() {
		cfg := deps.identity
		cfg.Identity = reg.Identity
		if s.verifier, err = identity.New(cfg); err != nil {
			return nil, err
		}
	}
	opened, err := delivery.Open(ctx, reg, getenv, delivery.Parts{Publisher: deps.publisher, Warehouse: deps.warehouse, Logger: log})
	if err != nil {
		return nil, err
	}
	s.svc, s.close = opened.Service, opened.Close
	return s, nil
}
