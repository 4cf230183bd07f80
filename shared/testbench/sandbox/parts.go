package sandbox

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
func (l *Local) start(ctx context.Context) error {
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
func (l *Local) startDatabases(ctx context.Context) error {
	cluster, err := pgtest.Start(ctx, pgtest.Config{})
	if err != nil {
		return err
	}
	l.Cluster = cluster
	l.cleanup = append(l.cleanup, func() { _ = cluster.Stop() })
	ontologyURL, err := cluster.CreateDatabase(ctx, "ontology", "")
	if err != nil {
		return err
	}
	warehouseURL, err := cluster.CreateDatabase(ctx, "warehouse", "")
	if err != nil {
		return err
	}
	l.Urls.OntologyDB, l.Urls.WarehouseDB = ontologyURL, warehouseURL
	if l.Ontology, err = pgxpool.New(ctx, ontologyURL); err != nil {
		return err
	}
	l.cleanup = append(l.cleanup, l.Ontology.Close)
	if err := sdkfixture.Install(ctx, l.Ontology, sdkfixture.Demo, 4); err != nil {
		return err
	}
	if l.Gen, err = sdkfixture.StartGeneration(ctx, l.Ontology, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true); err != nil {
		return err
	}
	l.Writer = sdkfixture.NewWriter(l.Ontology, sdkfixture.Demo)
	return nil
}

// startPubSub starts Pub/Sub: the topic, the BigQuery subscription (the
// feeder moves what it refused localMaxDeliveries times to the dead-letter
// topic, as a dead-letter policy does), and the dead-letter topic with a
// subscription that keeps them, named as terraform names them.
func (l *Local) startPubSub(ctx context.Context) error {
	l.Faults = &faultSwitch{}
	var err error
	l.Pubsub = pstest.NewServer(pstest.ServerReactorOption{FuncName: "Publish", Reactor: l.Faults})
	l.cleanup = append(l.cleanup, func() { _ = l.Pubsub.Close() })
	l.Client, err = pubsub.NewClient(ctx, localProject, option.WithEndpoint(l.Pubsub.Addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		return err
	}
	l.cleanup = append(l.cleanup, func() { _ = l.Client.Close() })
	for _, topic := range []string{LocalTopic, LocalDeadTopic} {
		if _, err := l.Client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
			return err
		}
	}
	if _, err := l.Client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: LocalSubscription, Topic: LocalTopic,
		AckDeadlineSeconds: 10}); err != nil {
		return err
	}
	if _, err := l.Client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: localDeadSub, Topic: LocalDeadTopic, AckDeadlineSeconds: 60}); err != nil {
		return err
	}
	// Each component reaches Pub/Sub through a fault proxy of its own (the
	// chaos run's wire faults on Publish, on every proxy at once; it passes
	// everything otherwise), which also tells which component published
	// what (published).
	l.Published = NewPublishLedger()
	l.PubsubProxies = map[string]*faultproxy.GRPC{}
	for _, component := range []string{ComponentDrain, ComponentVerify, ComponentJob} {
		proxy, err := faultproxy.NewGRPC(l.Pubsub.Addr, func(method string) bool { return method == publishMethod })
		if err != nil {
			return err
		}
		proxy.Observe(l.Published.observer(component))
		l.PubsubProxies[component] = proxy
		l.cleanup = append(l.cleanup, proxy.Close)
	}
	return nil
}

// publishMethod is the RPC the Pub/Sub fault proxy puts its faults on.
const publishMethod = "/google.pubsub.v1.Publisher/Publish"

// startWarehouse opens the warehouse (fed from the subscription), a
// BigQuery REST server backed by it for the verifier's lookups, and the
// runtime tokens' issuer.
func (l *Local) startWarehouse(ctx context.Context) error {
	var err error
	if l.Wh, err = localwarehouse.Open(ctx, l.Urls.WarehouseDB); err != nil {
		return err
	}
	l.cleanup = append(l.cleanup, l.Wh.Close)
	l.BigqueryFaults = &faultproxy.HTTP{Next: bqserver.New(l.Wh.QueryHandler())}
	if l.Urls.Bigquery, err = l.serve(l.BigqueryFaults); err != nil {
		return err
	}
	l.Issuer, err = tokenissuer.New("https://runtime.local", "local-key")
	if err != nil {
		return err
	}
	l.Urls.jwks, err = l.serve(l.Issuer)
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
func (l *Local) startFunctions(ctx context.Context) error {
	grants, err := sdkfixture.Grants(terraform.README)
	if err != nil {
		return err
	}
	roles, drop, err := sdkfixture.ComponentRoles(ctx, l.Ontology, l.Urls.OntologyDB, grants, 4)
	if err != nil {
		return err
	}
	l.cleanup = append(l.cleanup, func() { drop(context.Background()) })
	l.Urls.roles = roles
	if l.Config.CloudSQL {
		if err := l.startCloudSQL(); err != nil {
			return err
		}
	}
	if l.Config.Pooled {
		if err := l.startPooler(ctx); err != nil {
			return err
		}
	}
	l.Registry = l.registryFor("")
	if err := l.startDrains(ctx); err != nil {
		return err
	}
	verify, closeVerify, err := l.functionsHandler(ctx, ComponentVerify, "")
	if err != nil {
		return err
	}
	l.cleanup = append(l.cleanup, closeVerify)
	verifyURL, err := l.serve(verify)
	if err != nil {
		return err
	}
	l.Urls.Verify = verifyURL + "/Verify"
	if l.Config.Chaos {
		// Production's schedule: the verifier's passes sweep once a minute
		// (sweep), the passes between only verify (verify), so that the
		// chaos run can tell what the sweep delivered from the wake-ups'.
		l.Urls.Sweep = l.Urls.Verify
		frequent, closeFrequent, err := l.functionsHandler(ctx, ComponentVerify, "0")
		if err != nil {
			return err
		}
		l.cleanup = append(l.cleanup, closeFrequent)
		if l.Urls.Verify, err = l.serve(frequent); err != nil {
			return err
		}
		l.Urls.Verify += "/Verify"
	}
	reg, err := registry.Parse([]byte(l.registryFor(ComponentJob)))
	if err != nil {
		return err
	}
	if l.Svc, err = delivery.Open(ctx, delivery.OpenConfig{Registry: reg, PubSubEmulatorHost: l.PubsubProxies[ComponentJob].Addr, Logger: l.Log,
		Views: l.Wh, Pools: database.Config{MaxConns: 4, MaxOpen: 1, DialerOptions: l.dialerOptions(ComponentJob)}}); err != nil {
		return err
	}
	l.cleanup = append(l.cleanup, l.Svc.Close)
	return nil
}

// startDrains serves the drain: in this process, or with Config.Chaos as
// Config.Drains processes of the deployed entry point, the wake-ups spread over
// them as Cloud Run spreads them over its instances.
func (l *Local) startDrains(ctx context.Context) error {
	if !l.Config.Chaos {
		drain, closeDrain, err := l.functionsHandler(ctx, ComponentDrain, "")
		if err != nil {
			return err
		}
		l.cleanup = append(l.cleanup, closeDrain)
		base, err := l.serve(drain)
		if err != nil {
			return err
		}
		l.Urls.Drains = []string{base + drainPath}
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
	for i := range l.Config.Drains {
		name := fmt.Sprintf("%s-%d", ComponentDrain, i+1)
		env := []string{"REPLICATION_WORKSPACES=" + l.registryAs(ComponentDrain, name), "PUBSUB_EMULATOR_HOST=" + l.PubsubProxies[ComponentDrain].Addr,
			"LOG_LEVEL=" + l.logLevel}
		proc, err := newDrainProcess(ctx, i, name, binary, env, l.logs)
		if err != nil {
			return err
		}
		l.cleanup = append(l.cleanup, proc.Close)
		l.DrainProcs = append(l.DrainProcs, proc)
		l.Urls.Drains = append(l.Urls.Drains, proc.URL()+drainPath)
	}
	return nil
}

// drainPath is the drain's path for the local workspace.
const drainPath = "/api/internal/v1/workspaces/" + LocalWorkspace + "/ontology/replication/drain"

// The components' names, as application_name in PostgreSQL.
const (
	ComponentDrain  = "replication-drain"
	ComponentVerify = "replication-verify"
	ComponentJob    = "replication-job"
)

// registryFor is the run's registry for a component: its database URL is
// the component's role's, under its name (none: the registry the sandbox
// prints, as the job's role).
func (l *Local) registryFor(component string) string { return l.registryAs(component, component) }

// registryAs is registryFor with the component's sessions under
// application_name name.
func (l *Local) registryAs(component, name string) string {
	role := strings.TrimPrefix(cmp.Or(component, ComponentJob), "replication-")
	dbURL := l.Urls.roles[role]
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
		l.Issuer.URL, LocalAudience, l.Urls.jwks, LocalWorkspace, LocalOrganization, LocalSubject, database, localProject, localProject, l.Urls.Bigquery)
}

// functionsHandler builds the functions for one component, with
// VERIFY_SWEEP_BATCHES sweep (empty: the default). No Google-signed tokens
// here: the verifier's caller check is off (its loop calls it directly).
func (l *Local) functionsHandler(ctx context.Context, component, sweep string) (http.Handler, func(), error) {
	env := map[string]string{"REPLICATION_WORKSPACES": l.registryFor(component), "PUBSUB_EMULATOR_HOST": l.PubsubProxies[component].Addr,
		"VERIFY_TIME_BUDGET": l.Config.VerifyBudget.String(), "LOG_LEVEL": l.logLevel, functions.EnvVerifyCallerCheck: "off",
		functions.EnvSweepBatches: sweep}
	local, err := functions.NewHandler(ctx, func(k string) string { return env[k] }, functions.LocalOptions{Logger: l.Log, DialerOptions: l.dialerOptions(component)})
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
func (l *Local) serve(h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	l.cleanup = append(l.cleanup, func() { _ = srv.Close() })
	return "http://" + ln.Addr().String(), nil
}
