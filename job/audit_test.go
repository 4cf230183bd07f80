package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// auditLine is one workspace's line of `job audit --json`.
type auditLine struct {
	Workspace string               `json:"workspace"`
	OK        bool                 `json:"ok"`
	Error     string               `json:"error"`
	Result    delivery.AuditReport `json:"result"`
}

// audit runs `job audit --json` with args and returns its report and error.
func (h *harness) audit(args ...string) (delivery.AuditReport, error) {
	h.t.Helper()
	out, logs, err := h.run(h.ctx, append([]string{"audit", "--json", "--workspace", "w1", "--recheck-after", "50ms"}, args...)...)
	var doc struct {
		Workspaces []auditLine `json:"workspaces"`
	}
	require.NoError(h.t, json.Unmarshal([]byte(out), &doc), "audit output: %s\nlogs: %s", out, logs)
	require.Len(h.t, doc.Workspaces, 1)
	require.True(h.t, doc.Workspaces[0].OK, "audit failed: %s\nlogs: %s", doc.Workspaces[0].Error, logs)
	return doc.Workspaces[0].Result, err
}

// found lists an audit's differences as "view kind key", sorted.
func found(rep delivery.AuditReport) []string {
	var out []string
	for _, v := range rep.Views {
		for _, d := range v.Differences {
			out = append(out, v.View+" "+d.Kind+" "+d.RecordKey)
		}
	}
	slices.Sort(out)
	return out
}

// deliver publishes what is pending, lands it in the warehouse and
// verifies it: the pipeline's full round, as the commands run it.
func (h *harness) deliver() {
	h.t.Helper()
	h.mustRun("drain", "--workspace", "w1")
	h.land()
	h.mustRun("verify", "--workspace", "w1")
}

// TestAuditAndRepairCommands: `job audit` exits 0 on an equal warehouse,
// 1 with the differences in its JSON, 3 when it could not audit (an
// unknown entity); `job repair` says what it sent back to pending. What
// the audit finds and the repair mends is specified beside their code
// (shared/delivery/repair_test.go); this is the command's own work.
func TestAuditAndRepairCommands(t *testing.T) {
	h := newHarness(t, &sdkfixture.V4Template)
	wh := h.withWarehouse()
	h.start("w1")
	w := h.spaces["w1"].w
	var products []string
	for i := range 3 {
		p, err := w.Create(h.ctx, "product", map[string]any{"title": fmt.Sprintf("p%d", i)})
		require.NoError(t, err)
		products = append(products, p)
	}
	h.deliver()
	rep, err := h.audit()
	require.NoError(t, err, "a clean delivery: exit 0")
	require.True(t, rep.Equal)

	_, err = wh.Pool().Exec(h.ctx, `DELETE FROM events WHERE record_key = $1`, products[1])
	require.NoError(t, err)
	rep, err = h.audit()
	require.ErrorIs(t, err, errDiffers)
	require.Equal(t, 1, exitCode(err), "differences: exit 1")
	require.Equal(t, []string{"product " + delivery.DifferenceMissing + " " + products[1]}, found(rep))
	_, _, err = h.run(h.ctx, "audit", "--entity", "nosuch")
	require.ErrorContains(t, err, `unknown entity: entity "nosuch" is not replicated`)
	require.Equal(t, 3, exitCode(err), "not audited: exit 3")

	out := h.mustRun("repair", "--workspace", "w1", "--recheck-after", "50ms")
	require.Contains(t, out, "1 event sent back to pending (1 had been verified)")
	h.land()
	h.mustRun("verify", "--workspace", "w1")
	rep, err = h.audit()
	require.NoError(t, err, "%v", found(rep))
}

// TestAuditRechecksAfterTheVerifiersInterval: `job audit` and `job repair`
// without --recheck-after look again after the verifier's 30 s between
// two looks (the scheduled audit passes no flag), so a record that lands
// within it is not reported; the flag sets another.
func TestAuditRechecksAfterTheVerifiersInterval(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"audit", "repair"} {
		i := slices.IndexFunc(commands, func(c command) bool { return c.name == name })
		require.GreaterOrEqual(t, i, 0, name)
		for _, c := range []struct {
			args []string
			want time.Duration
		}{{nil, 30 * time.Second}, {[]string{"--recheck-after", "50ms"}, 50 * time.Millisecond}} {
			var e env
			_, _, err := e.parseFlags(commands[i], c.args)
			require.NoError(t, err)
			require.Equal(t, c.want, e.recheck, "%s %v", name, c.args)
			require.Equal(t, c.want, e.auditOptions().RecheckAfter, "%s %v: the audit is asked to look again then", name, c.args)
		}
	}
}
