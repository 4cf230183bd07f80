package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestFailingWorkspaceAmongTen: with one workspace's database out of reach,
// every command over ten workspaces does its work on the other nine, prints
// a line for each of the ten (FAILED and the cause for the one), and fails
// naming it.
func TestFailingWorkspaceAmongTen(t *testing.T) {
	t.Parallel()
	templates := make([]*pgtest.Template, 10)
	for i := range templates {
		templates[i] = &sdkfixture.V4Template
	}
	h := newHarness(t, templates...)
	var ids []string
	for i := range templates {
		id := fmt.Sprintf("w%d", i+1)
		ids = append(ids, id)
		h.start(id)
		h.products(id, 6)
	}
	// w5's database is gone.
	h.env["REPLICATION_WORKSPACES"] = strings.Replace(h.env["REPLICATION_WORKSPACES"], h.spaces["w5"].url,
		pgtest.Shared(t).URL("no_such_database"), 1)

	for _, tc := range []struct {
		command []string
		// done checks a healthy workspace's result of the command.
		done func(t *testing.T, id string)
	}{
		{[]string{"drain"}, func(t *testing.T, id string) {
			require.Len(t, h.published(id), 6, id)
		}},
		{[]string{"verify", "--budget", "1m"}, func(t *testing.T, id string) {
			require.EqualValues(t, 6, h.count(id, "SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NOT NULL"), id)
		}},
		{[]string{"views"}, func(t *testing.T, id string) {}},
		{[]string{"backfill"}, func(t *testing.T, id string) {
			require.EqualValues(t, 1, h.count(id, "SELECT count(*) FROM _ontology_replication_targets WHERE backfill_complete"), id)
		}},
		{[]string{"replay"}, func(t *testing.T, id string) {
			for e, n := range h.published(id) {
				require.Equal(t, 2, n, "%s: event %s published again by the replay", id, e)
			}
		}},
	} {
		t.Run(tc.command[0], func(t *testing.T) {
			ddl := len(h.ddl)
			out, logs, err := h.run(h.ctx, tc.command...)
			require.Error(t, err, "one workspace failed: the command fails; out:\n%s\nlogs:\n%s", out, logs)
			require.Contains(t, err.Error(), "w5", "the error names the failing workspace")
			require.Contains(t, err.Error(), "no_such_database")
			require.Contains(t, err.Error(), "1 of 10 workspaces", logs)
			lines := map[string][]string{}
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				ws, rest, _ := strings.Cut(line, "\t")
				lines[ws] = append(lines[ws], rest)
			}
			for _, id := range ids {
				require.NotEmpty(t, lines[id], "the summary has a line for %s:\n%s", id, out)
				if id == "w5" {
					require.True(t, strings.HasPrefix(lines[id][0], "FAILED: "), lines[id])
					continue
				}
				for _, l := range lines[id] {
					require.NotContains(t, l, "FAILED", id)
				}
				tc.done(t, id)
			}
			if tc.command[0] == "views" {
				require.Equal(t, 9*4, len(h.ddl)-ddl, "four views for each of the nine")
			}
		})
	}

	t.Run("status", func(t *testing.T) {
		out, _, err := h.run(h.ctx, "status")
		require.Error(t, err)
		require.Contains(t, err.Error(), "w5")
		for _, id := range ids {
			require.Regexp(t, "(?m)^"+id+" ", out, "the table has a row for %s", id)
		}
		require.Regexp(t, `(?m)^w5 .*no_such_database`, out)
	})
}
