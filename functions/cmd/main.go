// Command cmd serves the replication functions: the container image's entry
// point on Cloud Run and the local runner for manual tests.
//
//	REPLICATION_WORKSPACES_FILE=registry.json go run ./functions/cmd -port 8080
//
// It listens on every interface at -port ($PORT on Cloud Run), or at -addr
// (host:port): the local mode gives it 127.0.0.1, so that a demo on a
// laptop is not reachable from the network.
//
// With FUNCTION_TARGET=Drain (or Verify) it serves that one function at / and
// every path below it, as each Cloud Run service runs. Without it, it serves
// both: the drain at /api/internal/v1/workspaces/{workspace}/ontology/replication/drain
// (and /Drain), the verifier at /Verify.
//
// It serves from an http.Server of its own rather than the functions
// framework's, whose ListenAndServe sets no timeout: a client has 10 s to
// send its headers (64 KB at most), an idle connection is closed after 2
// minutes, and SIGTERM (Cloud Run's stop) stops accepting and waits up to
// 8 s for the requests in flight before the process ends.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/segmentstream/ontology-replication/functions"
)

// commit is the commit the image was built from (cloudbuild.yaml passes it
// with -ldflags "-X main.commit=$COMMIT_SHA"); -version prints it.
var commit string

func main() {
	var cfg functions.ServerConfig
	port := flag.String("port", cmp.Or(os.Getenv("PORT"), "8080"), "port to listen on, on every interface (default $PORT or 8080)")
	addr := flag.String("addr", "", "host:port to listen on instead, such as 127.0.0.1:8080 (a loopback address serves this machine only)")
	flag.DurationVar(&cfg.ReadHeaderTimeout, "read-header-timeout", 0, "the time a client has to send its request headers (default 10s)")
	flag.DurationVar(&cfg.IdleTimeout, "idle-timeout", 0, "how long a kept-alive connection may stay idle (default 2m)")
	flag.DurationVar(&cfg.ShutdownGrace, "shutdown-grace", 0, "how long a stop waits for the requests in flight and the drainers' batches out (default 8s)")
	showVersion := flag.Bool("version", false, "print the commit this build was made from, and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println("replication functions, commit", cmp.Or(commit, "unknown (not an image build)"))
		return
	}
	handler, err := functions.Handler(os.Getenv("FUNCTION_TARGET"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	l, err := net.Listen("tcp", cmp.Or(*addr, ":"+*port))
	if err != nil {
		fmt.Fprintln(os.Stderr, "functions:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := functions.Serve(ctx, l, handler, cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
