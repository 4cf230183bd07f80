package main

import (
	"bufio"
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
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
	"github.com/segmentstream/ontology-replication/shared/testbench/pipeline"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

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
	bin := filepath.Join(t.TempDir(), "functions")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)

	p := pipeline.OneWorkspace(t, 5)

	// serve starts the binary and returns its base URL once it listens,
	// or its output and exit error if it ends first.
	serve := func(t *testing.T, env ...string) (string, string, error) {
		t.Helper()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := l.Addr().(*net.TCPAddr).Port
		require.NoError(t, l.Close())
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), append([]string{"PORT=" + strconv.Itoa(port), "REPLICATION_WORKSPACES=" + p.Registry,
			"PUBSUB_EMULATOR_HOST=" + p.PubSub.Addr}, env...)...)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		cmd.Stderr = cmd.Stdout
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		lines := make(chan string)
		go func() {
			defer close(lines)
			scanner := bufio.NewScanner(stdout)
			for scanner.Scan() {
				lines <- scanner.Text()
			}
		}()
		var output strings.Builder
		base := fmt.Sprintf("http://127.0.0.1:%d", port)
		ready := time.NewTicker(20 * time.Millisecond)
		defer ready.Stop()
		for {
			select {
			case line, ok := <-lines:
				if !ok {
					return "", output.String(), cmd.Wait()
				}
				output.WriteString(line + "\n")
			case <-ready.C:
				if conn, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
					_ = conn.Close()
					go func() {
						for range lines {
						}
					}()
					return base, output.String(), nil
				}
			}
		}
	}
	call := func(t *testing.T, method, url string, header map[string]string) (int, map[string]any) {
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

	t.Run("Drain", func(t *testing.T) {
		base, logs, err := serve(t, "FUNCTION_TARGET=Drain")
		require.NoError(t, err, logs)
		token, err := p.Issuer.Token(pipeline.RuntimeSubject, pipeline.Audience, time.Minute)
		require.NoError(t, err)
		auth := map[string]string{"x-segmentstream-runtime-identity": token, "x-segmentstream-organization-id": pipeline.Organization}
		code, body := call(t, http.MethodPost, base+"/api/internal/v1/workspaces/w1/ontology/replication/drain", auth)
		require.Equal(t, http.StatusOK, code, body)
		require.Equal(t, 5.0, body["published"])
		require.Len(t, p.PubSub.Messages(), 5)
		for _, path := range []string{"/", "/Verify"} {
			code, _ = call(t, http.MethodPost, base+path, auth)
			require.Equal(t, http.StatusNotFound, code, "%s on the drain service is not the verifier", path)
		}
	})

	t.Run("Verify", func(t *testing.T) {
		base, logs, err := serve(t, "FUNCTION_TARGET=Verify", "VERIFY_CALLER_CHECK=off")
		require.NoError(t, err, logs)
		code, body := call(t, http.MethodPost, base+"/", nil)
		require.Equal(t, http.StatusOK, code, body)
		workspaces := body["workspaces"].([]any)
		require.Len(t, workspaces, 1)
		require.Equal(t, "verified", workspaces[0].(map[string]any)["outcome"])
		code, _ = call(t, http.MethodGet, base+"/", nil)
		require.Equal(t, http.StatusMethodNotAllowed, code)
	})

	t.Run("Verify without its caller settings", func(t *testing.T) {
		_, logs, err := serve(t, "FUNCTION_TARGET=Verify")
		require.Error(t, err, "it must not start")
		require.Contains(t, logs, "VERIFY_CALLER")
	})
}
