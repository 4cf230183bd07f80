package functions

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/cloudsqlproxy"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/terraform"
)

// cloudSQLToken is the functions' IAM login token at the stand-in.
const cloudSQLToken = "functions-login-token"

// cloudSQLHarness is the stand-in instance the harness's workspaces are
// reached through, and its IAM database user: the functions' service
// account's, a member of each workspace's drain and verify roles (which
// hold exactly the terraform README's GRANTs).
type cloudSQLHarness struct {
	t    *testing.T
	inst *cloudsqlproxy.Instance
	user string
}

// withCloudSQL puts the workspaces' databases on a Cloud SQL stand-in
// instance, reached through the connector with IAM login over its private
// IP.
func withCloudSQL(cfg cloudsqlproxy.Config) option_ {
	return func(c *harnessConfig) { c.cloudSQL = &cfg }
}

func newCloudSQLHarness(t *testing.T, cluster *pgtest.Cluster, cfg cloudsqlproxy.Config) *cloudSQLHarness {
	user := cloudsqlproxy.IAMUser(t, cluster, "replication-functions")
	cfg.Users = map[string]string{cloudSQLToken: user}
	return &cloudSQLHarness{t: t, inst: cloudsqlproxy.ForTest(t, cluster, cfg), user: user}
}

// database grants the IAM user the workspace's drain and verify roles
// and returns the registry's database entry for it.
func (c *cloudSQLHarness) database(ctx context.Context, ws *workspaceDB, cluster *pgtest.Cluster, legacy bool) string {
	grants, err := sdkfixture.Grants(terraform.README)
	require.NoError(c.t, err)
	protocol := 4
	if legacy {
		protocol = 3
	}
	_, drop, err := sdkfixture.ComponentRoles(ctx, ws.pool, ws.url, grants, protocol)
	require.NoError(c.t, err)
	c.t.Cleanup(func() { drop(context.Background()) })
	name := dbName(ws.url)
	roles := []string{pgx.Identifier{"replication-drain@" + name}.Sanitize(), pgx.Identifier{"replication-verify@" + name}.Sanitize()}
	require.NoError(c.t, cluster.Exec(ctx, fmt.Sprintf("GRANT %s TO %s", strings.Join(roles, ", "), pgx.Identifier{c.user}.Sanitize())))
	return fmt.Sprintf(`{"instance": "acme:europe-west1:ontology", "name": %q, "user": %q, "iam_auth": true, "private_ip": true}`, name, c.user)
}

// TestCloudSQLDrainAnswers: a workspace on Cloud SQL is drained and
// verified through the connector, and each fault of the Cloud SQL path
// meets the drainer with its cause, nothing acknowledged that Pub/Sub did
// not accept: the drainer answers the wake-ups meanwhile 503 and publishes
// the commit once the fault has passed, with no other wake-up.
func TestCloudSQLDrainAnswers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withCloudSQL(cloudsqlproxy.Config{CertLifetime: time.Minute}))
	inst := h.cloudSQL.inst
	published := 0
	commit := func() {
		t.Helper()
		_, err := h.spaces["w1"].w.Create(h.ctx, "customer", map[string]any{"email": fmt.Sprintf("c%d@example.com", time.Now().UnixNano())})
		require.NoError(t, err)
		code, body := h.wake("w1")
		require.Equal(t, http.StatusOK, code, "body %v, logs %s", body, h.logs.String())
	}
	// delivered: the drainer publishes the commit.
	delivered := func() {
		t.Helper()
		h.settle()
		published++
		require.Len(t, h.published("w1"), published, "logs %s", h.logs.String())
	}
	// meets: the drainer meets the fault, with its cause, and defers the
	// wake-ups meanwhile; nothing is published.
	meets := func(cause string) {
		t.Helper()
		h.awaitLogged(`"cause":"` + cause + `"`)
		code, body := h.wake("w1")
		require.Contains(t, []int{http.StatusServiceUnavailable, http.StatusInternalServerError}, code, "body %v", body)
		require.Len(t, h.published("w1"), published)
	}

	// The Admin API down at the first connection: the connection's cause.
	// The API back, the drainer recovers.
	inst.SetAdminDown(true)
	commit()
	meets(delivery.CauseDatabaseUnavailable)
	inst.SetAdminDown(false)
	delivered()
	require.Contains(t, inst.Dialled(), cloudsqlproxy.PrivateIP+":3307", "private_ip dials the instance's private address")

	// The refresh failing later, connections open: served by them.
	inst.SetAdminDown(true)
	commit()
	delivered()

	// The instance restarting drops them; the new connection's refresh
	// fails until the API is back.
	inst.Restart()
	h.logs.Reset()
	commit()
	meets(delivery.CauseDatabaseUnavailable)
	inst.SetAdminDown(false)
	delivered()

	// A restart alone: the drainer reconnects.
	inst.Restart()
	commit()
	delivered()

	// The IAM token refused: an ERROR that names the roles a person must
	// grant; once they are, the drainer recovers.
	inst.SetTokensRefused(true)
	inst.Restart()
	h.logs.Reset()
	commit()
	meets(delivery.CauseDatabaseDenied)
	require.Contains(t, h.logs.String(), "roles/cloudsql.instanceUser")
	inst.SetTokensRefused(false)
	delivered()

	// The verifier's pass goes through the connector too.
	code, pass := h.verify(`{}`)
	require.Equal(t, http.StatusOK, code)
	require.Len(t, pass.Workspaces, 1)
	require.Equal(t, 5, pass.Workspaces[0].Verified, "%+v", pass.Workspaces[0])
}
