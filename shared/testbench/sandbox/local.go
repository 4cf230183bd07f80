package sandbox

import (
	"context"
	"encoding/json"
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
	"github.com/segmentstream/ontology-replication/shared/testbench/cloudsqlproxy"
	"github.com/segmentstream/ontology-replication/shared/testbench/faultproxy"
	"github.com/segmentstream/ontology-replication/shared/testbench/localwarehouse"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgbouncer"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/testbench/tokenissuer"
)

// Config is how a sandbox runs: its workload's writers, its verifier's
// schedule, and how its components reach the database and the drain.
type Config struct {
	// Command names the command in its lines (local, chaos).
	Command       string
	Writers       int
	VerifyEvery   time.Duration
	VerifyTimeout time.Duration
	VerifyBudget  time.Duration
	// Chaos serves the drain as Drains processes of the deployed entry
	// point (a fault kills or freezes a process) and the verifier's sweep
	// apart from its passes that only verify, as the chaos run needs.
	Chaos bool
	// Drains is how many drain instances serve the wake-ups (Chaos).
	Drains int
	// CloudSQL reaches the database through the Cloud SQL connector and
	// the stand-in (--cloud-sql).
	CloudSQL bool
	// Pooled reaches it through a PgBouncer in session mode (--pooled).
	Pooled bool
}

// The local deployment's fixed names.
const (
	LocalWorkspace    = "demo"
	LocalOrganization = "org-demo"
	LocalSubject      = "runtime-demo"
	LocalAudience     = "replication"
	localProject      = "local-project"
	LocalTopic        = "projects/" + localProject + "/topics/ontology-replication"
	LocalDeadTopic    = "projects/" + localProject + "/topics/ontology-replication-dead-letter"
	LocalSubscription = "projects/" + localProject + "/subscriptions/bigquery"
	localDeadSub      = "projects/" + localProject + "/subscriptions/ontology-replication-dead-letter"
	// LocalMaxDeliveries is the BigQuery subscription's dead-letter policy.
	LocalMaxDeliveries = 5
)

// Local is one local run: every part, started and stopped together.
type Local struct {
	Config   Config
	Log      *slog.Logger
	logLevel string
	Out      io.Writer
	cleanup  []func()

	Cluster  *pgtest.Cluster
	Ontology *pgxpool.Pool
	Gen      sdkfixture.Generation
	Writer   *sdkfixture.Writer
	Pubsub   *pstest.Server
	Client   *pubsub.Client
	Faults   *faultSwitch
	// PubsubProxies are each component's way to Pub/Sub, bigqueryFaults
	// the product's way to BigQuery: where the chaos run puts its wire
	// faults. published is what the proxies saw published, by whom.
	PubsubProxies  map[string]*faultproxy.GRPC
	Published      *PublishLedger
	BigqueryFaults *faultproxy.HTTP
	// cloudSQL is the Cloud SQL stand-in (--cloud-sql).
	cloudSQL *cloudsqlproxy.Instance
	// pooler is the PgBouncer in front of the database (--pooled).
	pooler *pgbouncer.Server
	// DrainProcs are the chaos run's drain instances.
	DrainProcs []*DrainProcess
	// logs receives the drain process's lines (with LOG_LEVEL set).
	logs     io.Writer
	Wh       *localwarehouse.Local
	Feeder   *localwarehouse.Feeder
	Issuer   *tokenissuer.Issuer
	Urls     localURLs
	Registry string
	// Svc is the job's Service over this run's parts (the final audit).
	Svc       *delivery.Opened
	DeadCount atomic.Int64
	Commits   atomic.Int64
	Progress  *Progress
	// agedDeadLetter is set once the dead-lettered event's acceptance was
	// moved back (the lags stop counting then).
	agedDeadLetter atomic.Bool
	// deadHistory is the history id of the event sent to the dead letter.
	deadHistory atomic.Pointer[string]
}

type localURLs struct {
	Verify, Sweep, jwks, Bigquery, OntologyDB, WarehouseDB string
	// Drains are the drain's URLs, one per instance.
	Drains []string
	// roles are each component's database URL, as its role.
	roles map[string]string
}

// Close stops every part, the last started first.
func (l *Local) Close() {
	for i := len(l.cleanup) - 1; i >= 0; i-- {
		l.cleanup[i]()
	}
}

// faultSwitch makes Pub/Sub's Publish fail while on: the injected outage.
type faultSwitch struct {
	On      atomic.Bool
	Refused atomic.Int64 // publishes refused so far
}

// React implements pstest.Reactor: it fails Publish while the switch is on.
func (f *faultSwitch) React(any) (bool, any, error) {
	if f.On.Load() {
		f.Refused.Add(1)
		return true, nil, status.Error(codes.Unavailable, "injected Pub/Sub outage")
	}
	return false, nil, nil
}

// Wake calls the drain at url as the ontology service does after a
// commit: POST with the runtime token and organisation, 5 s, body ignored,
// a non-2xx only logged (the SDK logs it as deferred).
func (l *Local) Wake(ctx context.Context, url, token string) int {
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
func (l *Local) post(ctx context.Context, url, token string) wakeAnswer {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	req.Header.Set("x-segmentstream-runtime-identity", token)
	req.Header.Set("x-segmentstream-organization-id", LocalOrganization)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		l.Log.Warn("ontology.replication.deferred", slog.Any("error", err))
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
		l.Log.Info("ontology.replication.deferred", slog.Int("status", resp.StatusCode))
	}
	return wakeAnswer{status: resp.StatusCode, started: resp.StatusCode/100 == 2 && body.Promised && !body.Coalesced, run: body.Run, wake: body.Wake}
}

// Every calls fn every d until ctx ends, one call at a time.
func Every(ctx context.Context, d time.Duration, fn func()) {
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
