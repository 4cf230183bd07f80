package delivery_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
	"github.com/segmentstream/ontology-replication/shared/testbench/localwarehouse"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
)

// withLocalWarehouse makes a local warehouse (a PostgreSQL events table)
// the BigQuery that every query of the rig is answered from: lookups and
// the audit's reads. Events reach it only through land, as a BigQuery
// subscription writes them.
func withLocalWarehouse() rigOption { return func(c *rigConfig) { c.localWarehouse = true } }

func (r *rig) openLocalWarehouse(tb testing.TB) {
	wh, err := localwarehouse.Open(r.ctx, pgtest.NewDatabase(tb, nil))
	require.NoError(tb, err)
	tb.Cleanup(wh.Close)
	r.wh, r.landed = wh, map[string]bool{}
}

func (r *rig) fromLocalWarehouse(ctx context.Context, q bqserver.Query) (bqserver.Result, error) {
	res, err := r.wh.QueryHandler()(ctx, q)
	r.mu.Lock()
	after := r.afterRecordsRead
	r.mu.Unlock()
	if _, records := q.Params["buckets"]; records && after != nil {
		after()
	}
	return res, err
}

// land writes the messages Pub/Sub holds that the warehouse has not
// received yet.
func (r *rig) land(tb testing.TB) {
	tb.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var batch [][]byte
	for _, m := range r.srv.Messages() {
		if !r.landed[m.ID] {
			r.landed[m.ID] = true
			batch = append(batch, m.Data)
		}
	}
	if len(batch) > 0 {
		require.NoError(tb, r.wh.Ingest(r.ctx, batch))
	}
}

// deliver publishes what is pending, lands it and verifies it: the
// pipeline's full round.
func (r *rig) deliver(tb testing.TB) {
	tb.Helper()
	r.drainAll(tb)
	r.land(tb)
	res := r.verify(tb, delivery.VerifyAllOptions{})
	require.NotEqual(tb, delivery.OutcomeFailed, res.Outcome, res)
}

// audit audits w1, judging what differs a second time after 50 ms.
func (r *rig) audit(tb testing.TB, opts delivery.AuditOptions) delivery.AuditReport {
	tb.Helper()
	opts.RecheckAfter = cmp.Or(opts.RecheckAfter, 50*time.Millisecond)
	rep, err := r.svc.Audit(r.ctx, "w1", opts)
	require.NoError(tb, err)
	return rep
}

// repair repairs w1, judging what differs a second time after 50 ms.
func (r *rig) repair(tb testing.TB) delivery.RepairReport {
	tb.Helper()
	rep, err := r.svc.Repair(r.ctx, "w1", delivery.RepairOptions{AuditOptions: delivery.AuditOptions{RecheckAfter: 50 * time.Millisecond}})
	require.NoError(tb, err)
	return rep
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

// demoRecords are customers, products (one updated twice), a deleted
// customer and an order linked to a product, one commit each.
type demoRecords struct {
	customers, products []string
	order               string
}

func (r *rig) demoRecords(tb testing.TB, n int) demoRecords {
	tb.Helper()
	var d demoRecords
	for i := range n {
		c, err := r.w.Create(r.ctx, "customer", map[string]any{"name": fmt.Sprintf("c%d", i), "age": int64(i)})
		require.NoError(tb, err)
		d.customers = append(d.customers, c)
		p, err := r.w.Create(r.ctx, "product", map[string]any{"title": fmt.Sprintf("p%d", i), "stock": int64(i)})
		require.NoError(tb, err)
		d.products = append(d.products, p)
	}
	require.NoError(tb, r.w.Update(r.ctx, "product", d.products[1], map[string]any{"title": "p1, second"}))
	require.NoError(tb, r.w.Update(r.ctx, "product", d.products[1], map[string]any{"title": "p1, third"}))
	require.NoError(tb, r.w.Delete(r.ctx, "customer", d.customers[2]))
	var err error
	d.order, err = r.w.Create(r.ctx, "order", map[string]any{"reference": "o1", "customer_id": d.customers[0]})
	require.NoError(tb, err)
	require.NoError(tb, r.w.Link(r.ctx, "order", "products", d.order, d.products[0]))
	return d
}
