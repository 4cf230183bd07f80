package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/segmentstream/ontology-replication/functions"
)

// drainServer serves the Drain function on a fixed loopback address, as
// the `replication-drain` Cloud Run service does, and can be restarted the
// way Cloud Run replaces an instance: the stop that SIGTERM starts in
// functions/cmd (functions.Serve's context ends: no new connections, the
// requests in flight get the shutdown grace), the instance's pools and
// clients closed (what runs past the grace loses its database sessions, as
// it would with the process), then a new instance on the same address.
type drainServer struct {
	addr  string
	build func(ctx context.Context) (http.Handler, func(), error)
	grace time.Duration
	log   *slog.Logger

	mu       sync.Mutex
	stop     context.CancelFunc
	done     chan struct{}
	close    func()
	restarts int
}

// startDrainServer builds the first instance and serves it on a free
// loopback port.
func startDrainServer(ctx context.Context, log *slog.Logger, build func(ctx context.Context) (http.Handler, func(), error)) (*drainServer, error) {
	d := &drainServer{addr: "127.0.0.1:0", build: build, grace: 8 * time.Second, log: log}
	if err := d.startInstance(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *drainServer) startInstance(ctx context.Context) error {
	h, closeHandler, err := d.build(ctx)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", d.addr)
	for i := 0; err != nil && i < 50; i++ {
		time.Sleep(20 * time.Millisecond) // the last instance's socket may still be closing
		ln, err = net.Listen("tcp", d.addr)
	}
	if err != nil {
		closeHandler()
		return fmt.Errorf("drain server: listen on %s: %w", d.addr, err)
	}
	d.addr = ln.Addr().String()
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = functions.Serve(sctx, ln, h, functions.ServerConfig{ShutdownGrace: d.grace, Logger: d.log})
	}()
	d.stop, d.done, d.close = stop, done, closeHandler
	return nil
}

// URL is the server's base URL.
func (d *drainServer) URL() string { return "http://" + d.addr }

// restart stops the instance as SIGTERM does and starts a new one on the
// same address; wake-ups meanwhile are refused, as Cloud Run's would be
// retried on another instance or deferred by the SDK.
func (d *drainServer) restart(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.shutdown()
	d.restarts++
	return d.startInstance(ctx)
}

func (d *drainServer) shutdown() {
	if d.stop == nil {
		return
	}
	d.stop()
	<-d.done
	d.close()
	d.stop = nil
}

// Close stops the server for good.
func (d *drainServer) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.shutdown()
}
