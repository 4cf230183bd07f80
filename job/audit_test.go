package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/google/uuid"
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
// verifies it: the pipeline's full round.
func (h *harness) deliver() {
	h.t.Helper()
	h.mustRun("drain", "--workspace", "w1")
	h.land()
	h.mustRun("verify", "--workspace", "w1")
}

// demoRecords writes customers, products (one updated twice, one
// deleted) and an order linked to a product, one commit each.
type demoRecords struct {
	customers, products []string
	order               string
}

func (h *harness) demoRecords(n int) demoRecords {
	h.t.Helper()
	w := h.spaces["w1"].w
	var d demoRecords
	for i := range n {
		c, err := w.Create(h.ctx, "customer", map[string]any{"name": fmt.Sprintf("c%d", i), "age": int64(i)})
		require.NoError(h.t, err)
		d.customers = append(d.customers, c)
		p, err := w.Create(h.ctx, "product", map[string]any{"title": fmt.Sprintf("p%d", i), "stock": int64(i)})
		require.NoError(h.t, err)
		d.products = append(d.products, p)
	}
	require.NoError(h.t, w.Update(h.ctx, "product", d.products[1], map[string]any{"title": "p1, second"}))
	require.NoError(h.t, w.Update(h.ctx, "product", d.products[1], map[string]any{"title": "p1, third"}))
	require.NoError(h.t, w.Delete(h.ctx, "customer", d.customers[2]))
	var err error
	d.order, err = w.Create(h.ctx, "order", map[string]any{"reference": "o1", "customer_id": d.customers[0]})
	require.NoError(h.t, err)
	require.NoError(h.t, w.Link(h.ctx, "order", "products", d.order, d.products[0]))
	return d
}

// TestAuditFindsEachDamageAndRepairMendsIt: after a clean delivery the
// audit finds nothing; each kind of damage to the warehouse (all of a
// record's rows gone, its latest row gone so an older state shows, a
// tombstone lost, a record only the warehouse has, an edge gone) is found
// exactly, with nothing else; `job repair` re-delivers the four it can
// and the next audit finds only the record the source never had; a second
// repair publishes nothing.
func TestAuditFindsEachDamageAndRepairMendsIt(t *testing.T) {
	h := newHarness(t, &sdkfixture.V4Template)
	wh := h.withWarehouse()
	h.start("w1")
	d := h.demoRecords(5)
	h.deliver()

	rep, err := h.audit()
	require.NoError(t, err, "a clean delivery: exit 0")
	require.True(t, rep.Equal)
	require.Empty(t, found(rep))
	require.Zero(t, rep.InFlight, "everything was verified")
	require.Zero(t, rep.DifferingBuckets, "both sides sum the same figures")
	views := map[string]delivery.ViewAudit{}
	for _, v := range rep.Views {
		views[v.View] = v
		require.Equal(t, v.SourceRecords, v.WarehouseRecords, v.View)
	}
	require.EqualValues(t, 5, views["customer"].SourceRecords, "five customers, one a tombstone")
	require.EqualValues(t, 5, views["product"].SourceRecords)
	require.EqualValues(t, 1, views["order_products"].SourceRecords)

	// The damage.
	exec := func(q string, args ...any) {
		t.Helper()
		tag, err := wh.Pool().Exec(h.ctx, q, args...)
		require.NoError(t, err)
		require.NotZero(t, tag.RowsAffected(), q)
	}
	exec(`DELETE FROM events WHERE record_key = $1`, d.customers[0])
	exec(`DELETE FROM events WHERE record_key = $1 AND revision = (SELECT max(revision) FROM events WHERE record_key = $1)`, d.products[1])
	exec(`DELETE FROM events WHERE record_key = $1 AND deleted`, d.customers[2])
	stranger := uuid.NewString()
	exec(`INSERT INTO events (event_id, source_id, generation, entity_id, record_key, record_kind, schema_hash, revision, deleted, payload)
	  SELECT 'made-up', source_id, generation, entity_id, $1, record_kind, schema_hash, 1, false, '{}' FROM events WHERE record_key = $2 LIMIT 1`,
		stranger, d.customers[1])
	edge := d.order + ":" + d.products[0]
	exec(`DELETE FROM events WHERE record_key = $1`, edge)

	rep, err = h.audit()
	require.ErrorIs(t, err, errDiffers)
	require.Equal(t, 1, exitCode(err), "differences: exit 1")
	want := []string{
		"customer " + delivery.DifferenceAbsent + " " + stranger,
		"customer " + delivery.DifferenceDeleted + " " + d.customers[2],
		"customer " + delivery.DifferenceMissing + " " + d.customers[0],
		"order_products " + delivery.DifferenceMissing + " " + edge,
		"product " + delivery.DifferenceStale + " " + d.products[1],
	}
	slices.Sort(want)
	require.Equal(t, want, found(rep), "each damage, nothing else")
	require.EqualValues(t, 5, rep.Differences)
	require.EqualValues(t, 4, rep.Repairable)

	t.Run("chosen records", func(t *testing.T) {
		rep, err := h.audit("--records", d.products[1]+","+d.products[2])
		require.ErrorIs(t, err, errDiffers)
		require.Equal(t, []string{"product " + delivery.DifferenceStale + " " + d.products[1]}, found(rep))
	})
	t.Run("one entity", func(t *testing.T) {
		rep, err := h.audit("--entity", "product")
		require.ErrorIs(t, err, errDiffers)
		require.Len(t, rep.Views, 1)
		require.Equal(t, []string{"product " + delivery.DifferenceStale + " " + d.products[1]}, found(rep))
		_, _, err = h.run(h.ctx, "audit", "--entity", "nosuch")
		require.ErrorContains(t, err, `unknown entity: entity "nosuch" is not replicated`)
		require.Equal(t, 3, exitCode(err), "not audited: exit 3")
	})

	before := len(h.pubsub.Messages())
	out := h.mustRun("repair", "--workspace", "w1", "--recheck-after", "50ms")
	require.Contains(t, out, "4 events sent back to pending (4 had been verified)")
	require.Equal(t, before+4, len(h.pubsub.Messages()), "the four latest events re-published, nothing else")
	h.land()
	h.mustRun("verify", "--workspace", "w1")
	rep, err = h.audit()
	require.ErrorIs(t, err, errDiffers)
	require.Equal(t, []string{"customer " + delivery.DifferenceAbsent + " " + stranger}, found(rep),
		"repaired; the warehouse's own record is reported, never deleted")
	require.EqualValues(t, 1, h.count("w1", `SELECT count(*) FROM _ontology_replication_targets WHERE verified_count = (
	  SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NOT NULL)`), "verified_count kept true")

	out = h.mustRun("repair", "--workspace", "w1", "--recheck-after", "50ms")
	require.Contains(t, out, "0 events sent back to pending")
	require.Equal(t, before+4, len(h.pubsub.Messages()), "a second repair publishes nothing")
}

// TestAuditDuringWritesReportsOnlyWhatLaterAuditsConfirm: audits taken
// while the SDK writes and the pipeline delivers report only the one
// damaged record, which the audit after delivery confirms: events in
// flight are never differences.
func TestAuditDuringWritesReportsOnlyWhatLaterAuditsConfirm(t *testing.T) {
	h := newHarness(t, &sdkfixture.V4Template)
	wh := h.withWarehouse()
	h.start("w1")
	d := h.demoRecords(8)
	h.deliver()
	_, err := wh.Pool().Exec(h.ctx, `DELETE FROM events WHERE record_key = $1`, d.customers[0])
	require.NoError(t, err)
	damaged := []string{"customer " + delivery.DifferenceMissing + " " + d.customers[0]}

	ctx, stop := context.WithCancel(h.ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(2)
	go func() { // the SDK's writes: every live record but the damaged one
		defer wg.Done()
		w := h.spaces["w1"].w
		for i := 0; ctx.Err() == nil; i++ {
			var err error
			switch i % 3 {
			case 0:
				err = w.Update(ctx, "product", d.products[i%len(d.products)], map[string]any{"stock": int64(i)})
			case 1:
				err = w.Update(ctx, "customer", d.customers[3+i%(len(d.customers)-3)], map[string]any{"age": int64(i)})
			default:
				_, err = w.Create(ctx, "product", map[string]any{"title": fmt.Sprintf("new %d", i)})
			}
			if err != nil && ctx.Err() == nil {
				errs <- err
				return
			}
		}
	}()
	go func() { // the pipeline
		defer wg.Done()
		for ctx.Err() == nil {
			for _, args := range [][]string{{"drain", "--workspace", "w1"}, {"verify", "--workspace", "w1"}} {
				if _, logs, err := h.run(ctx, args...); err != nil && ctx.Err() == nil {
					errs <- fmt.Errorf("%v: %w\n%s", args, err, logs)
					return
				}
				if args[0] == "drain" {
					h.land()
				}
			}
		}
	}()
	var during [][]string
	for range 4 {
		rep, err := h.audit()
		require.True(t, err == nil || errors.Is(err, errDiffers), "%v", err)
		during = append(during, found(rep))
		t.Logf("in flight %d, differing buckets %d, differences %v", rep.InFlight, rep.DifferingBuckets, found(rep))
	}
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	h.deliver()
	rep, err := h.audit()
	require.ErrorIs(t, err, errDiffers)
	require.Zero(t, rep.InFlight, "everything delivered and verified")
	require.Equal(t, damaged, found(rep))
	for i, f := range during {
		require.Subset(t, damaged, f, "audit %d during the writes reported what the audit after delivery does not", i)
	}
}

// TestAuditJudgesNothingVerifiedAfterTheWarehouseWasRead: a record's new
// state lands and is verified between the audit's read of the warehouse
// (which still showed the old state) and its read of the source: the
// record is in flight, not stale.
func TestAuditJudgesNothingVerifiedAfterTheWarehouseWasRead(t *testing.T) {
	h := newHarness(t, &sdkfixture.V4Template)
	h.withWarehouse()
	h.start("w1")
	d := h.demoRecords(3)
	h.deliver()
	require.NoError(t, h.spaces["w1"].w.Update(h.ctx, "product", d.products[0], map[string]any{"title": "new"}))
	h.mustRun("drain", "--workspace", "w1")
	h.mu.Lock()
	h.afterRecordsRead = func() {
		h.land()
		h.mustRun("verify", "--workspace", "w1")
	}
	h.mu.Unlock()
	rep, err := h.audit()
	require.NoError(t, err, "%v", found(rep))
	require.EqualValues(t, 1, rep.InFlight)
	require.Zero(t, h.count("w1", `SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NULL`),
		"the new state was verified during the audit")
}

// TestAuditAndRepairAtProtocol3: on a legacy database the audit reads the
// receipts' verification, and the repair deletes the receipts of what it
// re-delivers, which the legacy drain then publishes.
func TestAuditAndRepairAtProtocol3(t *testing.T) {
	h := newHarness(t, &sdkfixture.V3Template)
	wh := h.withWarehouse()
	h.start("w1")
	d := h.demoRecords(4)
	h.deliver()
	rep, err := h.audit()
	require.NoError(t, err, "%v", found(rep))
	require.Zero(t, rep.InFlight)

	_, err = wh.Pool().Exec(h.ctx, `DELETE FROM events WHERE record_key = $1`, d.products[3])
	require.NoError(t, err)
	rep, err = h.audit()
	require.ErrorIs(t, err, errDiffers)
	require.Equal(t, []string{"product " + delivery.DifferenceMissing + " " + d.products[3]}, found(rep))

	out := h.mustRun("repair", "--workspace", "w1", "--recheck-after", "50ms")
	require.Contains(t, out, "1 events sent back to pending (1 had been verified)")
	h.land()
	h.mustRun("verify", "--workspace", "w1")
	rep, err = h.audit()
	require.NoError(t, err, "%v", found(rep))
}
