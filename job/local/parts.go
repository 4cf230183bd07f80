package main

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/segmentstream/ontology-replication/functions"
	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/registry"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
	"github.com/segmentstream/ontology-replication/shared/testbench/faultproxy"
	"github.com/segmentstream/ontology-replication/shared/testbench/localwarehouse"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/testbench/tokenissuer"
	"github.com/segmentstream/ontology-replication/terraform"
)

// start starts every part: PostgreSQL, the SDK database, Pub/Sub, the
// warehouse, the token issuer and the functions.
func (l *local) start(ctx context.Context) error {
	for _, step := range []func(context.Context) error{l.startDatabases, l.startPubSub, l.startWarehouse, l.startFunctions} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// startDatabases starts the PostgreSQL cluster with the SDK's database
// (the demo ontology at protocol 4, a generation active) and the
// warehouse's.
func (l *local) startDatabases(ctx context.Context) error {
	cluster, err := pgtest.Start(ctx, pgtest.Config{})
	if err != nil {
		return err
	}
	l.cluster = cluster
	l.cleanup = append(l.cleanup, func() { _ = cluster.Stop() })
	ontologyURL, err := cluster.CreateDatabase(ctx, "ontology", "")
	if err != nil {
		return err
	}
	warehouseURL, err := cluster.CreateDatabase(ctx, "warehouse", "")
	if err != nil {
		return err
	}
	l.urls.ontologyDB, l.urls.warehouseDB = ontologyURL, warehouseURL
	if l.ontology, err = pgxpool.New(ctx, ontologyURL); err != nil {
		return err
	}
	l.cleanup = append(l.cleanup, l.ontology.Close)
	if err := sdkfixture.Install(ctx, l.ontology, sdkfixture.Demo, 4); err != nil {
		return err
	}
	if l.gen, err = sdkfixture.StartGeneration(ctx, l.ontology, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true); err != nil {
		return err
	}
	l.writer = sdkfixture.NewWriter(l.ontology, sdkfixture.Demo)
	return nil
}

// startPubSub starts Pub/Sub: the topic, the BigQuery subscription (the
// feeder moves what it refused localMaxDeliveries times to the dead-letter
// topic, as a dead-letter policy does), and the dead-letter topic with a
// subscription that keeps them, named as terraform names them.
func (l *local) startPubSub(ctx context.Context) error {
	l.faults = &faultSwitch{}
	var err error
	l.pubsub = pstest.NewServer(pstest.ServerReactorOption{FuncName: "Publish", Reactor: l.faults})
	l.cleanup = append(l.cleanup, func() { _ = l.pubsub.Close() })
	l.client, err = pubsub.NewClient(ctx, localProject, option.WithEndpoint(l.pubsub.Addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		return err
	}
	l.cleanup = append(l.cleanup, func() { _ = l.client.Close() })
	for _, topic := range []string{localTopic, localDeadTopic} {
		if _, err := l.client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
			return err
		}
	}
	if _, err := l.client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: localSubscription, Topic: localTopic,
		AckDeadlineSeconds: 10}); err != nil {
		return err
	}
	if _, err := l.client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: localDeadSub, Topic: localDeadTopic, AckDeadlineSeconds: 60}); err != nil {
		return err
	}
	// Each component reaches Pub/Sub through a fault proxy of its own (the
	// chaos run's wire faults on Publish, on every proxy at once; it passes
	// everything otherwise), which also tells which component published
	// what (published).
	l.published = newPublishLedger()
	l.pubsubProxies = map[string]*faultproxy.GRPC{}
	for _, component := range []string{componentDrain, componentVerify, componentJob} {
		proxy, err := faultproxy.NewGRPC(l.pubsub.Addr, func(method string) bool { return method == publishMethod })
		if err != nil {
			return err
		}
		proxy.Observe(l.published.observer(component))
		l.pubsubProxies[component] = proxy
		l.cleanup = append(l.cleanup, proxy.Close)
	}
	return nil
}

// publishMethod is the RPC the Pub/Sub fault proxy puts its faults on.
const publishMethod = "/google.pubsub.v1.Publisher/Publish"

// startWarehouse opens the warehouse (fed from the subscription), a
// BigQuery REST server backed by it for the verifier's lookups, and the
// runtime tokens' issuer.
func (l *local) startWarehouse(ctx context.Context) error {
	var err error
	if l.wh, err = localwarehouse.Open(ctx, l.urls.warehouseDB); err != nil {
		return err
	}
	l.cleanup = append(l.cleanup, l.wh.Close)
	l.bigqueryFaults = &faultproxy.HTTP{Next: bqserver.New(l.wh.QueryHandler())}
	if l.urls.bigquery, err = l.serve(l.bigqueryFaults); err != nil {
		return err
	}
	l.issuer, err = tokenissuer.New("https://runtime.local", "local-key")
	if err != nil {
		return err
	}
	l.urls.jwks, err = l.serve(l.issuer)
	return err
}

// startFunctions serves the Drain and Verify functions as two services,
// each built as functions.NewHandler builds them with a registry of this
// run's parts, and opens the job's Service. Each component reaches the
// database as its own role, holding exactly the GRANTs of terraform's
// README (sdkfixture.ComponentRoles), and under its Cloud Run name
// (application_name), so that the chaos run can end one component's
// sessions. The chaos run's drain instances are the deployed entry point
// run as processes (drainProcess), so that their faults are a process's.
func (l *local) startFunctions(ctx context.Context) error {
	grants, err := sdkfixture.Grants(terraform.README)
	if err != nil {
		return err
	}
	roles, drop, err := sdkfixture.ComponentRoles(ctx, l.ontology, l.urls.ontologyDB, grants, 4)
	if err != nil {
		return err
	}
	l.cleanup = append(l.cleanup, func() { drop(context.Background()) })
	l.urls.roles = roles
	if l.cfg.cloudSQL {
		if err := l.startCloudSQL(); err != nil {
			return err
		}
	}
	if l.cfg.pooled {
		if err := l.startPooler(ctx); err != nil {
			return err
		}
	}
	l.registry = l.registryFor("")
	if err := l.startDrains(ctx); err != nil {
		return err
	}
	verify, closeVerify, err := l.functionsHandler(ctx, componentVerify, "")
	if err != nil {
		return err
	}
	l.cleanup = append(l.cleanup, closeVerify)
	verifyURL, err := l.serve(verify)
	if err != nil {
		return err
	}
	l.urls.verify = verifyURL + "/Verify"
	if l.cfg.chaos.duration != 0 {
		// Production's schedule: the verifier's passes sweep once a minute
		// (sweep), the passes between only verify (verify), so that the
		// chaos run can tell what the sweep delivered from the wake-ups'.
		l.urls.sweep = l.urls.verify
		frequent, closeFrequent, err := l.functionsHandler(ctx, componentVerify, "0")
		if err != nil {
			return err
		}
		l.cleanup = append(l.cleanup, closeFrequent)
		if l.urls.verify, err = l.serve(frequent); err != nil {
			return err
		}
		l.urls.verify += "/Verify"
	}
	reg, err := registry.Parse([]byte(l.registryFor(componentJob)))
	if err != nil {
		return err
	}
	if l.svc, err = delivery.Open(ctx, delivery.OpenConfig{Registry: reg, PubSubEmulatorHost: l.pubsubProxies[componentJob].Addr, Logger: l.log,
		Views: l.wh, Pools: database.Config{MaxConns: 4, MaxOpen: 1, DialerOptions: l.dialerOptions(componentJob)}}); err != nil {
		return err
	}
	l.cleanup = append(l.cleanup, l.svc.Close)
	return nil
}

// startDrains serves the drain: in this process, or with --chaos as
// --drains processes of the deployed entry point, the wake-ups spread over
// them as Cloud Run spreads them over its instances.
func (l *local) startDrains(ctx context.Context) error {
	if l.cfg.chaos.duration == 0 {
		drain, closeDrain, err := l.functionsHandler(ctx, componentDrain, "")
		if err != nil {
			return err
		}
		l.cleanup = append(l.cleanup, closeDrain)
		base, err := l.serve(drain)
		if err != nil {
			return err
		}
		l.urls.drains = []string{base + drainPath}
		return nil
	}
	dir, err := os.MkdirTemp("", "replication-local-")
	if err != nil {
		return err
	}
	l.cleanup = append(l.cleanup, func() { _ = os.RemoveAll(dir) })
	binary, err := buildDrain(ctx, dir)
	if err != nil {
		return err
	}
	for i := range l.cfg.drains {
		name := fmt.Sprintf("%s-%d", componentDrain, i+1)
		env := []string{"REPLICATION_WORKSPACES=" + l.registryAs(componentDrain, name), "PUBSUB_EMULATOR_HOST=" + l.pubsubProxies[componentDrain].Addr,
			"LOG_LEVEL=" + l.logLevel}
		proc, err := newDrainProcess(ctx, i, name, binary, env, l.logs)
		if err != nil {
			return err
		}
		l.cleanup = append(l.cleanup, proc.Close)
		l.drainProcs = append(l.drainProcs, proc)
		l.urls.drains = append(l.urls.drains, proc.URL()+drainPath)
	}
	return nil
}

// drainPath is the drain's path for the local workspace.
const drainPath = "/api/internal/v1/workspaces/" + localWorkspace + "/ontology/replication/drain"

// The components' names, as application_name in PostgreSQL.
const (
	componentDrain  = "replication-drain"
	componentVerify = "replication-verify"
	componentJob    = "replication-job"
)

// registryFor is the run's registry for a component: its database URL is
// the component's role's, under its name (none: the registry the sandbox
// prints, as the job's role).
func (l *local) registryFor(component string) string { return l.registryAs(component, component) }

// registryAs is registryFor with the component's sessions under
// application_name name.
func (l *local) registryAs(component, name string) string {
	role := strings.TrimPrefix(cmp.Or(component, componentJob), "replication-")
	dbURL := l.urls.roles[role]
	if name != "" {
		u, _ := url.Parse(dbURL)
		q := u.Query()
		q.Set("application_name", name)
		u.RawQuery = q.Encode()
		dbURL = u.String()
	}
	database := fmt.Sprintf(`{"url": %q}`, dbURL)
	switch {
	case l.cloudSQL != nil:
		database = l.cloudSQLDatabase(role)
	case l.pooler != nil:
		database = fmt.Sprintf(`{"url": %q, "pooled": true}`, l.pooledURL(dbURL))
	}
	return fmt.Sprintf(`{"identity": {"issuer": %q, "audience": %q, "jwks_url": %q},
  "workspaces": [{"id": %q, "organization_id": %q, "runtime_subject": %q, "database": %s,
    "pubsub": {"project": %q, "topic": "ontology-replication", "dead_letter_subscription": "ontology-replication-dead-letter"},
    "bigquery": {"project": %q, "dataset": "ontology_internal", "table": "events", "location": "local", "endpoint": %q}}]}`,
		l.issuer.URL, localAudience, l.urls.jwks, localWorkspace, localOrganization, localSubject, database, localProject, localProject, l.urls.bigquery)
}

// functionsHandler builds the functions for one component, with
// VERIFY_SWEEP_BATCHES sweep (empty: the default). No Google-signed tokens
// here: the verifier's caller check is off (its loop calls it directly).
func (l *local) functionsHandler(ctx context.Context, component, sweep string) (http.Handler, func(), error) {
	env := map[string]string{"REPLICATION_WORKSPACES": l.registryFor(component), "PUBSUB_EMULATOR_HOST": l.pubsubProxies[component].Addr,
		"VERIFY_TIME_BUDGET": l.cfg.verifyBudget.String(), "LOG_LEVEL": l.logLevel, functions.EnvVerifyCallerCheck: "off",
		functions.EnvSweepBatches: sweep}
	local, err := functions.NewHandler(ctx, func(k string) string { return env[k] }, functions.LocalOptions{Logger: l.log, DialerOptions: l.dialerOptions(component)})
	if err != nil {
		return nil, nil, err
	}
	closeLocal := func() {
		// The drainers carry out the wake-ups answered before the parts stop
		// (Close would release what they had not claimed yet).
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = local.Idle(ctx)
		local.Close()
	}
	return local.Handler, closeLocal, nil
}

// serve serves h on a free loopback port until the run ends.
func (l *local) serve(h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	l.cleanup = append(l.cleanup, func() { _ = srv.Close() })
	return "http://" + ln.Addr().String(), nil
}
