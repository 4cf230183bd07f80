package delivery_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestAuditFindsEachDamageAndRepairMendsIt: after a clean delivery the
// audit finds nothing; each kind of damage to the warehouse (all of a
// record's rows gone, its latest row gone so an older state shows, a
// tombstone lost, a record only the warehouse has, an edge gone) is found
// exactly, with nothing else; a repair re-delivers the four it can and the
// next audit finds only the record the source never had; a second repair
// publishes nothing.
func TestAuditFindsEachDamageAndRepairMendsIt(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4, withLocalWarehouse())
	d := r.demoRecords(t, 5)
	r.deliver(t)

	rep := r.audit(t, delivery.AuditOptions{})
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
		tag, err := r.wh.Pool().Exec(r.ctx, q, args...)
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

	rep = r.audit(t, delivery.AuditOptions{})
	require.False(t, rep.Equal)
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
		rep := r.audit(t, delivery.AuditOptions{Records: []string{d.products[1], d.products[2]}})
		require.Equal(t, []string{"product " + delivery.DifferenceStale + " " + d.products[1]}, found(rep))
	})
	t.Run("one entity", func(t *testing.T) {
		rep := r.audit(t, delivery.AuditOptions{Entities: []string{"product"}})
		require.Len(t, rep.Views, 1)
		require.Equal(t, []string{"product " + delivery.DifferenceStale + " " + d.products[1]}, found(rep))
		_, err := r.svc.Audit(r.ctx, "w1", delivery.AuditOptions{Entities: []string{"nosuch"}})
		require.ErrorIs(t, err, delivery.ErrUnknownEntity)
	})

	before := len(r.srv.Messages())
	fixed := r.repair(t)
	require.Equal(t, 4, fixed.Reset)
	require.Equal(t, 4, fixed.Verified, "all four had been verified")
	require.Equal(t, before+4, len(r.srv.Messages()), "the four latest events re-published, nothing else")
	r.land(t)
	r.verify(t, delivery.VerifyAllOptions{})
	rep = r.audit(t, delivery.AuditOptions{})
	require.Equal(t, []string{"customer " + delivery.DifferenceAbsent + " " + stranger}, found(rep),
		"repaired; the warehouse's own record is reported, never deleted")
	require.EqualValues(t, 1, r.count(t, `SELECT count(*) FROM _ontology_replication_targets WHERE verified_count = (
	  SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NOT NULL)`), "verified_count kept true")

	require.Zero(t, r.repair(t).Reset)
	require.Equal(t, before+4, len(r.srv.Messages()), "a second repair publishes nothing")
}

// TestAuditDuringWritesReportsOnlyWhatLaterAuditsConfirm: audits taken
// while the SDK writes and the pipeline delivers report only the one
// damaged record, which the audit after delivery confirms: events in
// flight are never differences.
func TestAuditDuringWritesReportsOnlyWhatLaterAuditsConfirm(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4, withLocalWarehouse())
	d := r.demoRecords(t, 8)
	r.deliver(t)
	_, err := r.wh.Pool().Exec(r.ctx, `DELETE FROM events WHERE record_key = $1`, d.customers[0])
	require.NoError(t, err)
	damaged := []string{"customer " + delivery.DifferenceMissing + " " + d.customers[0]}

	ctx, stop := context.WithCancel(r.ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(2)
	go func() { // the SDK's writes: every live record but the damaged one
		defer wg.Done()
		// Each write runs to its end (a write cancelled mid-commit may
		// still commit after it returned, behind the last delivery): the
		// loop stops between writes.
		for i := 0; ctx.Err() == nil; i++ {
			var err error
			switch i % 3 {
			case 0:
				err = r.w.Update(r.ctx, "product", d.products[i%len(d.products)], map[string]any{"stock": int64(i)})
			case 1:
				err = r.w.Update(r.ctx, "customer", d.customers[3+i%(len(d.customers)-3)], map[string]any{"age": int64(i)})
			default:
				_, err = r.w.Create(r.ctx, "product", map[string]any{"title": fmt.Sprintf("new %d", i)})
			}
			if err != nil {
				errs <- err
				return
			}
		}
	}()
	go func() { // the pipeline
		defer wg.Done()
		for ctx.Err() == nil {
			if _, err := r.svc.DrainAll(ctx, "w1", delivery.DrainAllOptions{}); err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("drain: %w", err)
				return
			}
			r.land(t)
			if res := r.svc.VerifyAll(ctx, delivery.VerifyAllOptions{}); res.Failed() && ctx.Err() == nil {
				errs <- fmt.Errorf("verify: %+v", res)
				return
			}
		}
	}()
	var during [][]string
	for range 4 {
		rep := r.audit(t, delivery.AuditOptions{})
		during = append(during, found(rep))
		t.Logf("in flight %d, differing buckets %d, differences %v", rep.InFlight, rep.DifferingBuckets, found(rep))
	}
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	r.deliver(t)
	rep := r.audit(t, delivery.AuditOptions{})
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
	t.Parallel()
	r := newRig(t, 4, withLocalWarehouse())
	d := r.demoRecords(t, 3)
	r.deliver(t)
	require.NoError(t, r.w.Update(r.ctx, "product", d.products[0], map[string]any{"title": "new"}))
	r.drainAll(t)
	r.mu.Lock()
	r.afterRecordsRead = func() {
		r.land(t)
		r.verify(t, delivery.VerifyAllOptions{})
	}
	r.mu.Unlock()
	rep := r.audit(t, delivery.AuditOptions{})
	require.True(t, rep.Equal, "%v", found(rep))
	require.EqualValues(t, 1, rep.InFlight)
	require.Zero(t, r.count(t, `SELECT count(*) FROM _ontology_replication_delivery WHERE verified_at IS NULL`),
		"the new state was verified during the audit")
}

// TestAuditAndRepairAtProtocol3: on a legacy database the audit reads the
// receipts' verification, and the repair deletes the receipts of what it
// re-delivers, which the legacy drain then publishes.
func TestAuditAndRepairAtProtocol3(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4, withLocalWarehouse(), withTemplate(&sdkfixture.V3Template))
	d := r.demoRecords(t, 4)
	r.deliver(t)
	rep := r.audit(t, delivery.AuditOptions{})
	require.True(t, rep.Equal, "%v", found(rep))
	require.Zero(t, rep.InFlight)

	_, err := r.wh.Pool().Exec(r.ctx, `DELETE FROM events WHERE record_key = $1`, d.products[3])
	require.NoError(t, err)
	rep = r.audit(t, delivery.AuditOptions{})
	require.Equal(t, []string{"product " + delivery.DifferenceMissing + " " + d.products[3]}, found(rep))

	fixed := r.repair(t)
	require.Equal(t, 1, fixed.Reset)
	require.Equal(t, 1, fixed.Verified)
	r.land(t)
	r.verify(t, delivery.VerifyAllOptions{})
	rep = r.audit(t, delivery.AuditOptions{})
	require.True(t, rep.Equal, "%v", found(rep))
}

// TestRepairMendsEveryPage: a repair of more records than one page of
// re-delivery (store.RedeliverPageSize) resets every one of them.
func TestRepairMendsEveryPage(t *testing.T) {
	t.Parallel()
	const records = store.RedeliverPageSize*2 + 500
	r := newRig(t, 4, withLocalWarehouse())
	r.products(t, records)
	r.deliver(t)
	_, err := r.wh.Pool().Exec(r.ctx, `DELETE FROM events`)
	require.NoError(t, err)
	fixed := r.repair(t)
	require.EqualValues(t, records, fixed.Audit.Repairable)
	require.Equal(t, records, fixed.Reset, "every page re-delivered")
	r.land(t)
	r.verify(t, delivery.VerifyAllOptions{Budget: 5 * time.Minute})
	require.True(t, r.audit(t, delivery.AuditOptions{}).Equal)
}
