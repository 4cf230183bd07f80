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
// IP, and bounds a drain's requeueing after transient faults.
func withCloudSQL(cfg cloudsqlproxy.Config, requeueFor time.Duration) option_ {
	return func(c *harnessConfig) { c.cloudSQL, c.requeueFor = &cfg, requeueFor }
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
// has its answer, with nothing acknowledged that Pub/Sub did not accept.
func TestCloudSQLDrainAnswers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withCloudSQL(cloudsqlproxy.Config{CertLifetime: time.Minute}, 5*time.Second))
	inst := h.cloudSQL.inst
	commit := func() {
		t.Helper()
		_, err := h.spaces["w1"].w.Create(h.ctx, "customer", map[string]any{"email": fmt.Sprintf("c%d@example.com", time.Now().UnixNano())})
		require.NoError(t, err)
	}
	expect := func(status int, cause string, published int) {
		t.Helper()
		before := len(h.published("w1"))
		h.logs.Reset()
		code, body := h.wake("w1")
		require.Equal(t, status, code, "body %v, logs %s", body, h.logs.String())
		if cause != "" {
			require.Contains(t, h.logs.String(), `"cause":"`+cause+`"`)
		}
		require.Len(t, h.published("w1"), before+published, "published only what the answer says")
	}

	// The Admin API down at the first connection: 503, the connection's
	// cause; nothing published. The next wake-up, the API back, recovers.
	inst.SetAdminDown(true)
	commit()
	expect(http.StatusServiceUnavailable, delivery.CauseDatabaseUnavailable, 0)
	inst.SetAdminDown(false)
	expect(http.StatusOK, "", 1)
	require.Contains(t, inst.Dialled(), cloudsqlproxy.PrivateIP+":3307", "private_ip dials the instance's private address")

	// The refresh failing later, connections open: served by them.
	inst.SetAdminDown(true)
	commit()
	expect(http.StatusOK, "", 1)

	// The instance restarting drops them; the new connection's refresh
	// fails: 503, and the commit stays pending for the next wake-up.
	inst.Restart()
	commit()
	expect(http.StatusServiceUnavailable, delivery.CauseDatabaseUnavailable, 0)
	inst.SetAdminDown(false)
	expect(http.StatusOK, "", 1)

	// A restart alone: the next wake-up reconnects.
	inst.Restart()
	commit()
	expect(http.StatusOK, "", 1)

	// The IAM token refused: 500 (a person must grant the roles), the
	// error naming them.
	inst.SetTokensRefused(true)
	inst.Restart()
	commit()
	expect(http.StatusInternalServerError, delivery.CauseDatabaseDenied, 0)
	require.Contains(t, h.logs.String(), "roles/cloudsql.instanceUser")
	inst.SetTokensRefused(false)
	expect(http.StatusOK, "", 1)

	// The verifier's pass goes through the connector too.
	code, pass := h.verify(`{}`)
	require.Equal(t, http.StatusOK, code)
	require.Len(t, pass.Workspaces, 1)
	require.Equal(t, 5, pass.Workspaces[0].Verified, "%+v", pass.Workspaces[0])
}
