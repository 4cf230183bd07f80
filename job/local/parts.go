package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
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
	// The product reaches Pub/Sub through the fault proxy (the chaos run's
	// wire faults on Publish; it passes everything otherwise).
	l.pubsubProxy, err = faultproxy.NewGRPC(l.pubsub.Addr, func(method string) bool { return method == publishMethod })
	if err != nil {
		return err
	}
	l.cleanup = append(l.cleanup, l.pubsubProxy.Close)
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
// database under its Cloud Run name (application_name), so that the chaos
// run can end one component's sessions. The chaos run's drain is the
// deployed entry point run as a process (drainProcess), so that its
// restart is a real SIGTERM.
func (l *local) startFunctions(ctx context.Context) error {
	l.registry = l.registryFor("")
	drainURL, err := l.startDrain(ctx)
	if err != nil {
		return err
	}
	verify, closeVerify, err := l.functionsHandler(ctx, componentVerify)
	if err != nil {
		return err
	}
	l.cleanup = append(l.cleanup, closeVerify)
	verifyURL, err := l.serve(verify)
	if err != nil {
		return err
	}
	reg, err := registry.Parse([]byte(l.registryFor(componentJob)))
	if err != nil {
		return err
	}
	if l.svc, err = delivery.Open(ctx, delivery.OpenConfig{Registry: reg, PubSubEmulatorHost: l.pubsubProxy.Addr, Logger: l.log,
		Views: l.wh, Pools: database.Config{MaxConns: 4, MaxOpen: 1}}); err != nil {
		return err
	}
	l.cleanup = append(l.cleanup, l.svc.Close)
	l.urls.drain = drainURL + "/api/internal/v1/workspaces/" + localWorkspace + "/ontology/replication/drain"
	l.urls.verify = verifyURL + "/Verify"
	return nil
}

// startDrain serves the drain: in this process, or with --chaos as a
// process of the deployed entry point.
func (l *local) startDrain(ctx context.Context) (string, error) {
	if l.cfg.chaos.duration == 0 {
		drain, closeDrain, err := l.functionsHandler(ctx, componentDrain)
		if err != nil {
			return "", err
		}
		l.cleanup = append(l.cleanup, closeDrain)
		return l.serve(drain)
	}
	dir, err := os.MkdirTemp("", "replication-local-")
	if err != nil {
		return "", err
	}
	l.cleanup = append(l.cleanup, func() { _ = os.RemoveAll(dir) })
	env := []string{"REPLICATION_WORKSPACES=" + l.registryFor(componentDrain), "PUBSUB_EMULATOR_HOST=" + l.pubsubProxy.Addr, "LOG_LEVEL=" + l.logLevel}
	if l.drainProc, err = buildDrainProcess(ctx, dir, env, l.logs); err != nil {
		return "", err
	}
	l.cleanup = append(l.cleanup, l.drainProc.Close)
	return l.drainProc.URL(), nil
}

// The components' names, as application_name in PostgreSQL.
const (
	componentDrain  = "replication-drain"
	componentVerify = "replication-verify"
	componentJob    = "replication-job"
)

// registryFor is the run's registry, its database URL naming component
// (none: the registry the sandbox prints).
func (l *local) registryFor(component string) string {
	dbURL := l.urls.ontologyDB
	if component != "" {
		u, _ := url.Parse(dbURL)
		q := u.Query()
		q.Set("application_name", component)
		u.RawQuery = q.Encode()
		dbURL = u.String()
	}
	return fmt.Sprintf(`{"identity": {"issuer": %q, "audience": %q, "jwks_url": %q},
  "workspaces": [{"id": %q, "organization_id": %q, "runtime_subject": %q, "database": {"url": %q},
    "pubsub": {"project": %q, "topic": "ontology-replication", "dead_letter_subscription": "ontology-replication-dead-letter"},
    "bigquery": {"project": %q, "dataset": "ontology_internal", "table": "events", "location": "local", "endpoint": %q}}]}`,
		l.issuer.URL, localAudience, l.urls.jwks, localWorkspace, localOrganization, localSubject, dbURL, localProject, localProject, l.urls.bigquery)
}

// functionsHandler builds the functions for one component. No
// Google-signed tokens here: the verifier's caller check is off (its loop
// calls it directly).
func (l *local) functionsHandler(ctx context.Context, component string) (http.Handler, func(), error) {
	env := map[string]string{"REPLICATION_WORKSPACES": l.registryFor(component), "PUBSUB_EMULATOR_HOST": l.pubsubProxy.Addr,
		"VERIFY_TIME_BUDGET": l.cfg.verifyBudget.String(), "LOG_LEVEL": l.logLevel, functions.EnvVerifyCallerCheck: "off"}
	return functions.NewHandler(ctx, func(k string) string { return env[k] }, functions.LocalOptions{Logger: l.log})
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
