package pgtest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Template is a database built once per cluster and copied for each test
// that asks for it, so tests share the cost of building a schema.
type Template struct {
	// Name identifies the template; it is unique within a test binary.
	Name string
	// Build builds the template database at url. It must close every
	// connection it opens, since PostgreSQL copies only idle templates.
	Build func(ctx context.Context, url string) error
}

// The one cluster of a test binary, started by Main (or on first use) and
// stopped when Main returns. This is test-harness state, as httptest's is.
var (
	sharedOnce    sync.Once
	sharedCluster *Cluster
	sharedErr     error
	counter       atomic.Int64
)

// templateState is one template database of one cluster.
type templateState struct {
	once sync.Once
	name string
	err  error
}

// Main runs a test binary's tests (call it from TestMain) and stops the
// shared cluster afterwards, if one was started, whatever the tests did.
func Main(m *testing.M) {
	code := m.Run()
	if sharedCluster != nil {
		if err := sharedCluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	os.Exit(code)
}

// Shared returns the test binary's cluster, starting it on first use. The
// test fails if no cluster can be had.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		sharedCluster, sharedErr = Start(ctx, Config{})
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return sharedCluster
}

// uniqueName returns a database name no other test binary on the same
// server uses.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s_%d_%d_%d", prefix, os.Getpid(), time.Now().UnixNano()%1e6, counter.Add(1))
}

// NewDatabase creates a fresh database on the shared cluster for one test;
// see Cluster.NewDatabase.
func NewDatabase(t testing.TB, tpl *Template) string {
	t.Helper()
	return Shared(t).NewDatabase(t, tpl)
}

// NewDatabase creates a fresh database for one test, as a copy of tpl (built
// on this cluster on first use) or empty when tpl is nil, drops it when the
// test ends, and returns its URL.
func (c *Cluster) NewDatabase(t testing.TB, tpl *Template) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	from := ""
	if tpl != nil {
		v, _ := c.templates.LoadOrStore(tpl.Name, &templateState{})
		s := v.(*templateState)
		s.once.Do(func() {
			s.name = uniqueName("tpl_" + tpl.Name)
			var url string
			if url, s.err = c.CreateDatabase(ctx, s.name, ""); s.err == nil {
				s.err = tpl.Build(ctx, url)
			}
			if s.err != nil {
				s.err = fmt.Errorf("pgtest: build template %s: %w", tpl.Name, s.err)
			}
		})
		if s.err != nil {
			t.Fatal(s.err)
		}
		from = s.name
	}
	name := uniqueName("test")
	url, err := c.CreateDatabase(ctx, name, from)
	if err != nil {
		t.Fatal(err)
	}
	if c.disposable {
		return url // it goes with the cluster
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.DropDatabase(ctx, name); err != nil {
			t.Errorf("drop test database: %v", err)
		}
	})
	return url
}

// dropTemplates drops the template databases built on this cluster.
func (c *Cluster) dropTemplates(ctx context.Context) {
	c.templates.Range(func(_, v any) bool {
		if s := v.(*templateState); s.err == nil && s.name != "" {
			_ = c.DropDatabase(ctx, s.name)
		}
		return true
	})
}
