package cloudsqlproxy

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
)

// ForTest starts an instance whose server is the test's cluster, stopped
// when the test ends. It skips the test when the cluster is
// $DATABASE_URL's, whose Unix socket this process cannot reach.
func ForTest(t testing.TB, cluster *pgtest.Cluster, cfg Config) *Instance {
	t.Helper()
	if cluster.SocketDir() == "" {
		t.Skip("the Cloud SQL stand-in forwards to a throwaway cluster's Unix socket; DATABASE_URL's server has none here")
	}
	cfg.SocketDir, cfg.Port = cluster.SocketDir(), cluster.Port()
	if cfg.ConnName == "" {
		cfg.ConnName = "acme:europe-west1:ontology"
	}
	i, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(i.Close)
	return i
}

var users atomic.Int64

// IAMUser creates a login role named as Cloud SQL names a service
// account's IAM database user (name@project.iam), unique to this test
// process, and drops it when the test ends.
func IAMUser(t testing.TB, cluster *pgtest.Cluster, name string) string {
	t.Helper()
	role := fmt.Sprintf("%s-%d-%d@acme.iam", name, os.Getpid(), users.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cluster.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = cluster.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize())
	})
	return role
}
