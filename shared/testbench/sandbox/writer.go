package sandbox

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/segmentstream/ontology-replication/shared/event"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// LocalWriter is one workload writer: it owns its records, so writers never
// touch each other's.
type LocalWriter struct {
	L   *Local
	Rng *rand.Rand
	// Ww commits (nil: the run's writer).
	Ww        *sdkfixture.Writer
	customers []string
	products  []string
	orders    []string
	edges     [][2]string
}

func (w *LocalWriter) pick(ids []string) string { return ids[w.Rng.IntN(len(ids))] }

func remove(ids []string, id string) []string {
	if i := slices.Index(ids, id); i >= 0 {
		return slices.Delete(ids, i, i+1)
	}
	return ids
}

// writer is the writer the commits go through.
func (w *LocalWriter) writer() *sdkfixture.Writer {
	if w.Ww != nil {
		return w.Ww
	}
	return w.L.Writer
}

// Step commits one random change and returns its kind. What the writer
// knows of its records changes only with a commit that succeeded.
func (w *LocalWriter) Step(ctx context.Context) (string, error) {
	ww := w.writer()
	roll := w.Rng.IntN(100)
	switch {
	case roll < 15 && len(w.orders) > 0 && len(w.products) > 0:
		o, p := w.pick(w.orders), w.pick(w.products)
		for _, e := range w.edges {
			if e == [2]string{o, p} {
				return w.create(ctx)
			}
		}
		if err := ww.Link(ctx, "order", "products", o, p); err != nil {
			return "link", err
		}
		w.edges = append(w.edges, [2]string{o, p})
		return "link", nil
	case roll < 22 && len(w.edges) > 0:
		i := w.Rng.IntN(len(w.edges))
		e := w.edges[i]
		if err := ww.Unlink(ctx, "order", "products", e[0], e[1]); err != nil {
			return "unlink", err
		}
		w.edges = slices.Delete(w.edges, i, i+1)
		return "unlink", nil
	case roll < 47 && len(w.products)+len(w.customers)+len(w.orders) > 3:
		switch w.Rng.IntN(3) {
		case 0:
			if len(w.customers) > 0 {
				return "update", ww.Update(ctx, "customer", w.pick(w.customers), map[string]any{"score": w.Rng.Float64() * 100, "active": w.Rng.IntN(2) == 0, "age": w.Rng.IntN(90)})
			}
		case 1:
			if len(w.products) > 0 {
				return "update", ww.Update(ctx, "product", w.pick(w.products), map[string]any{"price": float64(w.Rng.IntN(10000)) / 100, "stock": w.Rng.IntN(500)})
			}
		default:
			if len(w.orders) > 0 {
				return "update", ww.Update(ctx, "order", w.pick(w.orders), map[string]any{"paid": true, "placed_at": time.Now().UTC()})
			}
		}
		return w.create(ctx)
	case roll < 57 && len(w.products) > 2:
		p := w.pick(w.products)
		if err := ww.Delete(ctx, "product", p); err != nil {
			return "delete", err
		}
		w.products = remove(w.products, p)
		w.edges = slices.DeleteFunc(w.edges, func(e [2]string) bool { return e[1] == p })
		return "delete", nil
	}
	return w.create(ctx)
}

func (w *LocalWriter) create(ctx context.Context) (string, error) {
	ww := w.writer()
	switch w.Rng.IntN(3) {
	case 0:
		id, err := ww.Create(ctx, "customer", map[string]any{"name": fmt.Sprintf("Customer %d", w.Rng.IntN(1e6)),
			"email": fmt.Sprintf("c%d@example.com", w.Rng.IntN(1e6)), "age": 18 + w.Rng.IntN(60), "score": w.Rng.Float64(),
			"active": true, "birthday": "1990-01-02", "signed_up_at": time.Now().UTC(), "attributes": map[string]any{"tier": w.Rng.IntN(3)}})
		if err == nil {
			w.customers = append(w.customers, id)
		}
		return "create", err
	case 1:
		id, err := ww.Create(ctx, "product", map[string]any{"title": fmt.Sprintf("Product %d", w.Rng.IntN(1e6)),
			"price": float64(w.Rng.IntN(10000)) / 100, "stock": w.Rng.IntN(100)})
		if err == nil {
			w.products = append(w.products, id)
		}
		return "create", err
	default:
		values := map[string]any{"reference": fmt.Sprintf("O-%d", w.Rng.IntN(1e6)), "total": float64(w.Rng.IntN(100000)) / 100,
			"quantity": 1 + w.Rng.IntN(5), "paid": false, "details": map[string]any{"channel": "web"}}
		if len(w.customers) > 0 {
			values["customer_id"] = w.pick(w.customers)
		}
		id, err := ww.Create(ctx, "order", values)
		if err == nil {
			w.orders = append(w.orders, id)
		}
		return "create", err
	}
}

// CreateDeadLetterTarget creates the customer whose event the warehouse
// will refuse until it is dead-lettered; it returns the event id.
func (w *LocalWriter) CreateDeadLetterTarget(ctx context.Context) (string, string, error) {
	// Not added to the writer's customers: later updates would carry the
	// marker too.
	id, err := w.L.Writer.Create(ctx, "customer", map[string]any{"name": "Dead Letter", "email": DeadLetterMarker})
	if err != nil {
		return "", "", err
	}
	history, err := sdkfixture.HistoryID(ctx, w.L.Ontology, sdkfixture.Demo, "customer", id, "create")
	if err != nil {
		return "", "", err
	}
	w.L.deadHistory.Store(&history)
	return "create", event.ID(w.L.Gen.SourceID, history, w.L.Gen.Generation), nil
}
