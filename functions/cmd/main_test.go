package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/pipeline"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestFunctionTargetAsCloudRunRunsIt runs the container's entry point, the
// built binary, as each Cloud Run service runs it: FUNCTION_TARGET names
// the one function served at every path, PORT the port. The drain service
// answers the SDK's drain path and nothing else; the verifier service
// answers POST / and refuses to start without its caller settings.
// binary builds the functions' entry point once for the package's tests.
var binary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "functions-cmd")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "functions")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("%w: %s", err, out)
	}
	return bin, nil
})

// running is the built binary serving on a port.
type running struct {
	base string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  strings.Builder
	done chan struct{} // closed when the process's output ends
}

func (r *running) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}

// serve starts the binary with the pipeline's registry and returns it once
// it listens, or its output and exit error if it ends first.
func serve(t *testing.T, p *pipeline.Pipeline, args []string, env ...string) (*running, error) {
	t.Helper()
	bin, err := binary()
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), append([]string{"PORT=" + strconv.Itoa(port), "REPLICATION_WORKSPACES=" + p.Registry,
		"PUBSUB_EMULATOR_HOST=" + p.PubSub.Addr}, env...)...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = cmd.Stdout
	require.NoError(t, cmd.Start())
	r := &running{base: fmt.Sprintf("http://127.0.0.1:%d", port), cmd: cmd, done: make(chan struct{})}
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-r.done; _ = cmd.Wait() })
	go func() {
		defer close(r.done)
		scanner := bufio.NewScanner(stdout)
		scanner.Buffer(nil, 1<<20)
		for scanner.Scan() {
			r.mu.Lock()
			r.out.WriteString(scanner.Text() + "\n")
			r.mu.Unlock()
		}
	}()
	ready := time.NewTicker(20 * time.Millisecond)
	defer ready.Stop()
	for {
		select {
		case <-r.done:
			return r, cmd.Wait()
		case <-ready.C:
			if conn, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
				_ = conn.Close()
				return r, nil
			}
		}
	}
}

// TestFunctionTargetAsCloudRunRunsIt runs the container's entry point, the
// built binary, as each Cloud Run service runs it: FUNCTION_TARGET names
// the one function served at every path, PORT the port. The drain service
// answers the SDK's drain path and nothing else; the verifier service
// answers POST / and refuses to start without its caller settings.
func TestFunctionTargetAsCloudRunRunsIt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the functions")
	}
	t.Parallel()
	p := pipeline.OneWorkspace(t, 5)
	call := callJSON

	t.Run("Drain", func(t *testing.T) {
		r, err := serve(t, p, nil, "FUNCTION_TARGET=Drain")
		require.NoError(t, err, r.output())
		base := r.base
		token, err := p.Issuer.Token(pipeline.RuntimeSubject, pipeline.Audience, time.Minute)
		require.NoError(t, err)
		auth := map[string]string{"x-segmentstream-runtime-identity": token, "x-segmentstream-organization-id": pipeline.Organization}
		code, body := call(t, http.MethodPost, base+"/api/internal/v1/workspaces/w1/ontology/replication/drain", auth)
		require.Equal(t, http.StatusOK, code, body)
		require.Equal(t, map[string]any{"workspace": "w1", "promised": true, "coalesced": false, "run": 1.0, "wake": 1.0}, body)
		awaitMessages(t, p, 5) // published behind the answer
		for _, path := range []string{"/", "/Verify"} {
			code, _ = call(t, http.MethodPost, base+path, auth)
			require.Equal(t, http.StatusNotFound, code, "%s on the drain service is not the verifier", path)
		}
	})

	t.Run("Verify", func(t *testing.T) {
		r, err := serve(t, p, nil, "FUNCTION_TARGET=Verify", "VERIFY_CALLER_CHECK=off")
		require.NoError(t, err, r.output())
		base := r.base
		code, body := call(t, http.MethodPost, base+"/", nil)
		require.Equal(t, http.StatusOK, code, body)
		workspaces := body["workspaces"].([]any)
		require.Len(t, workspaces, 1)
		require.Equal(t, "verified", workspaces[0].(map[string]any)["outcome"])
		code, _ = call(t, http.MethodGet, base+"/", nil)
		require.Equal(t, http.StatusMethodNotAllowed, code)
	})

	t.Run("Verify without its caller settings", func(t *testing.T) {
		r, err := serve(t, p, nil, "FUNCTION_TARGET=Verify")
		require.Error(t, err, "it must not start")
		require.Contains(t, r.output(), "VERIFY_CALLER")
	})
}

// callJSON calls the server and decodes its JSON answer.
func callJSON(t *testing.T, method, url string, header map[string]string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader("{}"))
	require.NoError(t, err)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var body map[string]any
	require.NoError(t, json.Unmarshal(raw, &body), "%s", raw)
	return resp.StatusCode, body
}

// TestSlowClientsAreCut: the built server closes a connection whose client
// sends its headers too slowly (100 of them, each stuck mid-header), and a
// kept-alive connection left idle, at the configured bounds: none stays
// open. Each connection's read returns when the server closes it.
func TestSlowClientsAreCut(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the functions")
	}
	t.Parallel()
	p := pipeline.OneWorkspace(t, 1)
	r, err := serve(t, p, []string{"-read-header-timeout", "1s", "-idle-timeout", "1s"}, "FUNCTION_TARGET=Drain")
	require.NoError(t, err, r.output())
	addr := strings.TrimPrefix(r.base, "http://")
	closed := make(chan error, 101)
	for range 100 {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		_, err = conn.Write([]byte("POST /api/internal/v1/workspaces/w1/ontology/replication/drain HTTP/1.1\r\nHost: x\r\nX-Slow: "))
		require.NoError(t, err)
		go func() {
			// The test's own bound: far past the server's 1 s.
			_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, err := io.ReadAll(conn)
			closed <- err
		}()
	}
	// A kept-alive connection after a whole request, then idle.
	idle, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = idle.Close() })
	_, err = idle.Write([]byte("GET /other HTTP/1.1\r\nHost: x\r\n\r\n"))
	require.NoError(t, err)
	go func() {
		_ = idle.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			_, err = idle.Read(make([]byte, 1)) // EOF once the server closes the idle connection
			if err == io.EOF {
				err = nil
			}
		}
		closed <- err
	}()
	for range 101 {
		err := <-closed
		require.NoError(t, err, "the server closed every slow and idle connection (a timeout here means it held one)")
	}
}

// awaitMessages waits, a minute at most, until Pub/Sub holds n messages.
func awaitMessages(t *testing.T, p *pipeline.Pipeline, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for len(p.PubSub.Messages()) < n {
		require.True(t, time.Now().Before(deadline), "%d of %d messages published after a minute", len(p.PubSub.Messages()), n)
		time.Sleep(10 * time.Millisecond) // Pub/Sub's store is the signal
	}
}

// TestStopDuringAHeldPublish sends SIGTERM (Cloud Run's stop) to the built
// server while its drainer's publish is held by Pub/Sub (the wake-up was
// answered at once). Released within the grace, the drainer finishes:
// published, acknowledged, and the process exits 0 saying its drains
// finished. Held past the grace (its default, 8 s, or 300 ms), the process
// exits anyway within Cloud Run's 10 s, nothing is acknowledged, it says
// what it left, and its claim is released (no advisory lock is left): the
// next wake-up publishes the batch.
func TestStopDuringAHeldPublish(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the functions")
	}
	t.Parallel()
	wake := func(t *testing.T, p *pipeline.Pipeline, base string) int {
		token, err := p.Issuer.Token(pipeline.RuntimeSubject, pipeline.Audience, time.Minute)
		require.NoError(t, err)
		code, _ := callJSON(t, http.MethodPost, base+"/api/internal/v1/workspaces/w1/ontology/replication/drain",
			map[string]string{"x-segmentstream-runtime-identity": token, "x-segmentstream-organization-id": pipeline.Organization})
		return code
	}
	count := func(t *testing.T, p *pipeline.Pipeline, q string) int {
		var n int
		require.NoError(t, p.Pool.QueryRow(context.Background(), q).Scan(&n))
		return n
	}

	t.Run("released within the grace", func(t *testing.T) {
		p := pipeline.OneWorkspace(t, 5)
		r, err := serve(t, p, []string{"-shutdown-grace", "60s"}, "FUNCTION_TARGET=Drain")
		require.NoError(t, err, r.output())
		arrived, release := p.HoldPublishes()
		defer release()
		require.Equal(t, http.StatusOK, wake(t, p, r.base), "answered before the publish")
		<-arrived
		require.NoError(t, r.cmd.Process.Signal(syscall.SIGTERM))
		// The server stops accepting: new connections are refused.
		deadline := time.Now().Add(30 * time.Second)
		for {
			require.True(t, time.Now().Before(deadline), "the stopping server still accepts connections")
			conn, err := net.Dial("tcp", strings.TrimPrefix(r.base, "http://"))
			if err != nil {
				break
			}
			_ = conn.Close()
			time.Sleep(10 * time.Millisecond)
		}
		release()
		<-r.done
		require.NoError(t, r.cmd.Wait(), r.output())
		require.Contains(t, r.output(), `"drains_finished":true`)
		require.Len(t, p.PubSub.Messages(), 5)
		require.Equal(t, 5, count(t, p, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL"), "acknowledged")
	})

	for _, grace := range []string{"default", "300ms"} {
		t.Run("held past the grace of "+grace, func(t *testing.T) {
			p := pipeline.OneWorkspace(t, 5)
			var flags []string
			if grace != "default" {
				flags = []string{"-shutdown-grace", grace}
			}
			r, err := serve(t, p, flags, "FUNCTION_TARGET=Drain")
			require.NoError(t, err, r.output())
			arrived, release := p.HoldPublishes()
			defer release()
			require.Equal(t, http.StatusOK, wake(t, p, r.base))
			<-arrived
			stopped := time.Now()
			require.NoError(t, r.cmd.Process.Signal(syscall.SIGTERM))
			<-r.done
			took := time.Since(stopped)
			require.NoError(t, r.cmd.Wait(), r.output())
			require.Less(t, took, 10*time.Second, "Cloud Run's SIGKILL comes 10 s after its SIGTERM")
			require.Contains(t, r.output(), `"drains_finished":false`)
			require.Contains(t, r.output(), delivery.LogDrainLeft)
			require.Zero(t, count(t, p, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL"), "nothing acknowledged")
			// The process is gone, and with its connections the claim: the
			// server drops an ended session's locks.
			deadline := time.Now().Add(30 * time.Second)
			for count(t, p, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
				AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) > 0 {
				require.True(t, time.Now().Before(deadline), "the ended process's claim is still held")
				time.Sleep(10 * time.Millisecond)
			}
			release()
			r2, err := serve(t, p, nil, "FUNCTION_TARGET=Drain")
			require.NoError(t, err, r2.output())
			require.Equal(t, http.StatusOK, wake(t, p, r2.base), "the next wake-up publishes the batch")
			deadline = time.Now().Add(time.Minute)
			for count(t, p, "SELECT count(*) FROM _ontology_replication_delivery WHERE accepted_at IS NOT NULL") < 5 {
				require.True(t, time.Now().Before(deadline), "the next drainer did not publish the batch")
				time.Sleep(10 * time.Millisecond) // the queue is the signal
			}
		})
	}
}
