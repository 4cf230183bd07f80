package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/functions"
	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/logging"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
	"github.com/segmentstream/ontology-replication/shared/testbench/tokenissuer"
)

// grantsOf returns the GRANT statements of the terraform README's Database
// access section: the privileges an operator gives each component.
func grantsOf(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile("../terraform/README.md")
	require.NoError(t, err)
	grants, err := sdkfixture.Grants(readme)
	require.NoError(t, err)
	return grants
}

// leastPrivilegeRoles creates, in a workspace's database, the three
// components' roles holding exactly the README's GRANTs (the README's
// names, for this database: roles are the cluster's) and returns each
// one's URL.
func leastPrivilegeRoles(t *testing.T, h *harness, id string, protocol int) map[string]string {
	t.Helper()
	urls, drop, err := sdkfixture.ComponentRoles(h.ctx, h.spaces[id].pool, h.spaces[id].url, grantsOf(t), protocol)
	require.NoError(t, err, "%s: the README's GRANTs run as the database owner", id)
	t.Cleanup(func() { drop(context.Background()) })
	return urls
}

// TestLeastPrivilege runs the drain, the verifier and the job's commands
// each as a role holding exactly the terraform README's GRANTs (nothing
// else: no ownership, no superuser), over every path that writes, on three
// databases: upgraded to protocol 4 (with a backfill to do), a fresh
// protocol 4 one (its baseline events drained) and one at protocol 3. The
// paths: claim, publish and acknowledgement, setting an event aside,
// verification, the absent-event retry, the 15-minute requeue and the
// sweep, backfill, set-aside retry, replay and status. A statement that
// needs a privilege the README does not grant fails here with "permission
// denied"; the mutations in the note of issue 19 (a privilege removed from
// the README) each fail one of the subtests.
func TestLeastPrivilege(t *testing.T) {
	t.Parallel()
	h := newHarness(t, &upgradedTemplate, &sdkfixture.V4Template, &sdkfixture.V3Template)
	ctx := h.ctx
	protocols := map[string]int{"w1": 4, "w2": 4, "w3": 3}
	urls := map[string]map[string]string{}
	for id, protocol := range protocols {
		urls[id] = leastPrivilegeRoles(t, h, id, protocol)
	}
	owner := h.spaces["w1"].pool

	// w1: new events after the upgrade, one of which Pub/Sub refuses; the
	// template's older ones wait for the backfill. w2 and w3: a generation
	// with its baseline, then new events.
	h.products("w1", 30)
	_, err := h.spaces["w1"].w.Create(ctx, "product", map[string]any{"title": "REFUSED"})
	require.NoError(t, err)
	refused := h.refuse("REFUSED")
	for _, id := range []string{"w2", "w3"} {
		h.products(id, 5)
		h.start(id)
		h.products(id, 10)
	}

	issuer, err := tokenissuer.New("https://runtime.test", "k1")
	require.NoError(t, err)
	jwks := httptest.NewServer(issuer)
	t.Cleanup(jwks.Close)
	registryAs := func(component string) string {
		var entries []string
		for _, id := range []string{"w1", "w2", "w3"} {
			entries = append(entries, fmt.Sprintf(`{"id": %q, "organization_id": "org-1", "runtime_subject": "runtime-%s", "database": {"url": %q},
				"pubsub": {"project": "p1", "topic": "events-%s"}, "bigquery": {"project": "p1", "location": "EU", "endpoint": %q}}`,
				id, id, urls[id][component], id, h.bqURL))
		}
		return fmt.Sprintf(`{"identity": {"issuer": %q, "audience": "replication", "jwks_url": %q}, "workspaces": [%s]}`,
			issuer.URL, jwks.URL, strings.Join(entries, ","))
	}
	var logs syncBuffer
	function := func(component string) *functions.Local {
		env := map[string]string{"REPLICATION_WORKSPACES": registryAs(component), "PUBSUB_EMULATOR_HOST": h.pubsub.Addr,
			functions.EnvVerifyCallerCheck: "off"}
		local, err := functions.NewHandler(ctx, func(k string) string { return env[k] },
			functions.LocalOptions{Logger: logging.New(&logs, logging.Config{Level: slog.LevelInfo})})
		require.NoError(t, err)
		t.Cleanup(local.Close)
		return local
	}
	serve := func(handler http.Handler, req *http.Request) {
		t.Helper()
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		require.Equal(t, http.StatusOK, rec.Code, "%s %s: %s\nlogs:\n%s", req.Method, req.URL.Path, rec.Body, logs.String())
	}
	status := func() map[string]workspaceStatus {
		out := map[string]workspaceStatus{}
		for _, s := range h.statusJSON() {
			out[s.Workspace] = s
		}
		return out
	}
	before := status()

	t.Run("drain", func(t *testing.T) {
		drain := function("drain")
		for id := range protocols {
			token, err := issuer.Token("runtime-"+id, "replication", time.Minute)
			require.NoError(t, err)
			req := httptest.NewRequest(http.MethodPost, "/api/internal/v1/workspaces/"+id+"/ontology/replication/drain", nil)
			req.Header.Set("x-segmentstream-runtime-identity", token)
			req.Header.Set("x-segmentstream-organization-id", "org-1")
			serve(drain.Handler, req)
		}
		idle, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		require.NoError(t, drain.Idle(idle), "the drainers carried out every wake-up")
		require.Len(t, h.published("w1"), 30, "every event but the refused one")
		require.Positive(t, refused.requests.Load())
		after := status()
		require.EqualValues(t, 1, after["w1"].SetAside.Count, "the refused one set aside")
		for _, id := range []string{"w2", "w3"} {
			require.Len(t, h.published(id), int(before[id].Pending), "%s: baseline and history events", id)
			require.Positive(t, before[id].Pending, id)
			require.Zero(t, after[id].Pending, id)
		}
	})

	t.Run("verify", func(t *testing.T) {
		// One accepted event of w1 has been missing from BigQuery for 16
		// minutes: the pass requeues it and its sweep publishes it again;
		// another is missing since now: it is retried later.
		pick := func(order string) (historyID, eventID string) {
			var generation, source string
			require.NoError(t, owner.QueryRow(ctx, `SELECT d.event_id::text, d.generation::text, h.replication->>'source_id'
				FROM _ontology_replication_delivery d JOIN product_history h ON h.id = d.event_id
				WHERE d.accepted_at IS NOT NULL ORDER BY d.event_id `+order+` LIMIT 1`).Scan(&historyID, &generation, &source))
			return historyID, event.ID(source, historyID, generation)
		}
		requeued, requeuedEvent := pick("ASC")
		absent, absentEvent := pick("DESC")
		_, err := owner.Exec(ctx, `UPDATE _ontology_replication_delivery SET accepted_at = now() - interval '16 minutes'
			WHERE event_id = $1::uuid`, requeued)
		require.NoError(t, err)
		h.hide(requeuedEvent, absentEvent)
		defer h.hide()
		serve(function("verify").Handler, httptest.NewRequest(http.MethodPost, "/Verify", strings.NewReader("{}")))
		require.EqualValues(t, 28, h.count("w1", "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NOT NULL"))
		require.EqualValues(t, 2, h.published("w1")[requeuedEvent], "requeued and published again by the sweep")
		require.EqualValues(t, 1, h.count("w1", `SELECT count(*) FROM _ontology_replication_delivery
			WHERE event_id = $1::uuid AND verified_at IS NULL AND next_verify_at > now()`, absent), "the absent one is looked at again later")
		after := status()
		for _, id := range []string{"w2", "w3"} {
			require.Zero(t, after[id].Unverified, "%s: every event verified", id)
			require.Equal(t, after[id].Total, after[id].Verified, id)
		}
	})

	job := func(args ...string) string {
		t.Helper()
		out, logs, err := h.runEnv(ctx, map[string]string{"REPLICATION_WORKSPACES": registryAs("job")}, args...)
		require.NoError(t, err, "job %v as the job's role; logs:\n%s", args, logs)
		require.NotContains(t, logs, "permission denied", "job %v", args)
		return out
	}
	t.Run("job", func(t *testing.T) {
		refused.on.Store(false)
		job("status")
		job("set-aside", "--retry")
		job("drain")
		require.Zero(t, status()["w1"].Pending+status()["w1"].SetAside.Count, "the set-aside event delivered once Pub/Sub takes it")
		job("backfill", "--workspace", "w1")
		job("verify")
		job("replay")
		job("verify")
		// A partial replay, and a repair of chosen records: the store's own
		// resets, under the same grants.
		job("replay", "--entity", "product", "--since-revision", "1")
		job("verify")
		job("repair", "--entity", "product", "--records", "no-such-record")
		for id, s := range status() {
			require.Zero(t, s.Pending, id)
			require.Zero(t, s.Unverified, id)
			require.Equal(t, s.Total, s.Verified, "%s: backfilled, replayed and verified", id)
		}
		require.Greater(t, status()["w1"].Total, int64(2500))
	})
}
