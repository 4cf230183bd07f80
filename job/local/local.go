package main

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

// chaosConfig is the chaos run's flags: how long the faults run, the seed
// of their schedule and the SDK workload's rate while it is busy.
type chaosConfig struct {
	duration time.Duration
	seed     uint64
	rate     float64
	// plot is where --plot writes the run's timeline (SVG).
	plot string
}

// minChaos is the shortest chaos run: long enough for every fault kind
// and operation to happen at least once, and the verifier's passes to meet
// the BigQuery faults.
const minChaos = 45 * time.Second
