package functions

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Handler returns the functions as the deployed server serves them, the
// way the functions framework would: with target "Drain" or "Verify" (Cloud
// Run's FUNCTION_TARGET) that one function at / and every path below it;
// with "" both, the drain at the SDK's drain path and /Drain, the verifier
// at /Verify. It refuses a configuration Check refuses.
func Handler(target string) (http.Handler, error) {
	if err := Check(target); err != nil {
		return nil, err
	}
	switch target {
	case "Drain":
		return http.HandlerFunc(serveDrain), nil
	case "Verify":
		return http.HandlerFunc(serveVerify), nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/Drain", serveDrain)
	mux.HandleFunc("/Verify", serveVerify)
	mux.HandleFunc(drainPrefix, serveDrain)
	return mux, nil
}

// ServerConfig bounds what a client can hold of the deployed server.
type ServerConfig struct {
	// ReadHeaderTimeout bounds the time a client takes to send its request
	// headers: a slow client cannot hold a connection open. Default: 10s.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a kept-alive connection idle this long. Default:
	// 2m (more than the front end's own keep-alive, so that it is the one
	// to close).
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers (a runtime token is about
	// 1 KB). Default: 64 KB.
	MaxHeaderBytes int
	// ShutdownGrace is how long a stop (Cloud Run's SIGTERM, then SIGKILL
	// 10 s later) waits for the requests in flight and the drainers'
	// batches out. Default: 8s.
	ShutdownGrace time.Duration
	// Logger receives the server's own lines (nil: the functions' logger).
	Logger *slog.Logger
}

func (c ServerConfig) withDefaults() ServerConfig {
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = 10 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 2 * time.Minute
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = 64 << 10
	}
	if c.ShutdownGrace <= 0 {
		c.ShutdownGrace = 8 * time.Second
	}
	return c
}

// LogServerStopped is the server's last line: how its stop went.
const LogServerStopped = "replication functions stopped"

// Serve serves h on l until ctx ends, then stops gracefully, within
// ShutdownGrace (Cloud Run sends SIGTERM and, 10 s later, SIGKILL): the
// drain answers wake-ups 503 from then on, the server accepts no more
// connections and waits for the requests in flight (each answers at once),
// and each drainer still claims what it promised (at once, no gathering),
// publishes and acknowledges its batches, and ends
// (delivery.Service.Shutdown). What is still out when the grace runs out
// is released unacknowledged: nothing is acknowledged
// that Pub/Sub did not accept, and each drainer that left work logs it
// (delivery.LogDrainLeft). It releases the functions' pools and clients
// before it returns.
func Serve(ctx context.Context, l net.Listener, h http.Handler, cfg ServerConfig) error {
	cfg = cfg.withDefaults()
	log := cmp.Or(cfg.Logger, app.log)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: cfg.ReadHeaderTimeout, IdleTimeout: cfg.IdleTimeout, MaxHeaderBytes: cfg.MaxHeaderBytes,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	select {
	case err := <-served:
		return fmt.Errorf("functions: serve: %w", err)
	case <-ctx.Done():
	}
	started := time.Now()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownGrace)
	defer cancel()
	drained := make(chan error, 1)
	go func() {
		if app.svc == nil {
			drained <- nil
			return
		}
		drained <- app.svc.Shutdown(sctx)
	}()
	err := srv.Shutdown(sctx)
	finished := err == nil
	if errors.Is(err, context.DeadlineExceeded) {
		err = nil // the grace ran out: what runs still ends with the process
	}
	drainsFinished := <-drained == nil
	if app.close != nil {
		app.close()
	}
	log.Info(LogServerStopped, slog.String("cause", context.Cause(ctx).Error()), slog.Bool("requests_finished", finished),
		slog.Bool("drains_finished", drainsFinished), slog.Float64("shutdown_seconds", time.Since(started).Seconds()))
	return err
}
