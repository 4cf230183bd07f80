// Package pipeline builds, for a test, everything the functions need around
// one workspace: its SDK database with a generation and some events, a
// pstest Pub/Sub server with the workspace's topic, a runtime token issuer
// with its JWKS, a BigQuery server that finds every event it is asked for,
// and the registry that names them. It serves tests only and is never
// deployed.
package pipeline

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/testbench/tokenissuer"
)

// The workspace's names in the registry.
const (
	Workspace      = "w1"
	Organization   = "org-1"
	RuntimeSubject = "runtime-w1"
	Audience       = "replication"
	Topic          = "projects/p1/topics/events"
)

// Pipeline is one workspace's surroundings; every part is closed when the
// test ends.
type Pipeline struct {
	// DatabaseURL and Pool reach the workspace's database as its owner.
	DatabaseURL string
	Pool        *pgxpool.Pool
	// PubSub holds the topic (PUBSUB_EMULATOR_HOST is PubSub.Addr).
	PubSub *pstest.Server
	// Issuer signs runtime tokens the registry's identity accepts.
	Issuer *tokenissuer.Issuer
	// Registry is the registry document (REPLICATION_WORKSPACES).
	Registry string
	// DenyBigQuery, while set, makes BigQuery answer every query 403
	// accessDenied, as it does once the verifier's grant is revoked.
	DenyBigQuery atomic.Bool

	hold atomic.Pointer[publishHold]
}

// publishHold holds Publish requests: each signals arrived, then waits for
// release.
type publishHold struct {
	arrived chan struct{}
	release chan struct{}
}

// React implements pstest.Reactor for Publish.
func (p *Pipeline) React(any) (bool, any, error) {
	if h := p.hold.Load(); h != nil {
		h.arrived <- struct{}{}
		<-h.release
	}
	return false, nil, nil
}

// HoldPublishes makes Pub/Sub hold every Publish request until release is
// called; arrived receives a value as each request arrives.
func (p *Pipeline) HoldPublishes() (arrived <-chan struct{}, release func()) {
	h := &publishHold{arrived: make(chan struct{}, 100), release: make(chan struct{})}
	p.hold.Store(h)
	var once sync.Once
	return h.arrived, func() {
		once.Do(func() {
			p.hold.Store(nil)
			close(h.release)
		})
	}
}

// OneWorkspace starts a pipeline whose workspace has a generation and
// products events pending.
func OneWorkspace(t testing.TB, products int) *Pipeline {
	t.Helper()
	ctx := context.Background()
	p := &Pipeline{DatabaseURL: pgtest.NewDatabase(t, &sdkfixture.V4Template)}
	var err error
	p.Pool, err = pgxpool.New(ctx, p.DatabaseURL)
	require.NoError(t, err)
	t.Cleanup(p.Pool.Close)
	_, err = sdkfixture.StartGeneration(ctx, p.Pool, sdkfixture.Demo, sdkfixture.Demo.FullSelection(), true)
	require.NoError(t, err)
	require.NoError(t, sdkfixture.BulkCreate(ctx, p.Pool, sdkfixture.Demo, "product", "title", products, products))
	p.PubSub = pstest.NewServer(pstest.ServerReactorOption{FuncName: "Publish", Reactor: p})
	t.Cleanup(func() { _ = p.PubSub.Close() })
	_, err = p.PubSub.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: Topic})
	require.NoError(t, err)
	p.Issuer, err = tokenissuer.New("https://runtime.test", "k1")
	require.NoError(t, err)
	jwks := httptest.NewServer(p.Issuer)
	t.Cleanup(jwks.Close)
	bq := httptest.NewServer(bqserver.New(func(_ context.Context, q bqserver.Query) (bqserver.Result, error) {
		if p.DenyBigQuery.Load() {
			return bqserver.Result{}, &bqserver.Error{Status: http.StatusForbidden, Reason: "accessDenied", Message: "Access Denied: Table p1:ontology_internal.events: User does not have permission to query table"}
		}
		return bqserver.Strings("event_id", q.Params["ids"].Values), nil
	}))
	t.Cleanup(bq.Close)
	p.Registry = fmt.Sprintf(`{"identity": {"issuer": %q, "audience": %q, "jwks_url": %q},
		"workspaces": [{"id": %q, "organization_id": %q, "runtime_subject": %q, "database": {"url": %q},
		"pubsub": {"project": "p1", "topic": "events"}, "bigquery": {"project": "p1", "endpoint": %q}}]}`,
		p.Issuer.URL, Audience, jwks.URL, Workspace, Organization, RuntimeSubject, p.DatabaseURL, bq.URL)
	return p
}
