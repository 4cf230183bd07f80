package functions

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/segmentstream/ontology-replication/shared/delivery"
)

// verifyRequest is the Verify function's optional JSON body.
type verifyRequest struct {
	// Workspace limits the run to one workspace; empty means all.
	Workspace string `json:"workspace"`
}

// verifyResponse is the Verify function's answer.
type verifyResponse struct {
	Workspaces []delivery.VerifyResult `json:"workspaces"`
}

// serveVerify is the Verify function, run by Cloud Scheduler every minute
// (the service is private: Cloud Run checks the scheduler's OIDC token). For
// every workspace, or the one named in the body, it runs verification rounds
// and then sweeps pending events, within the time budget. It answers 200 when
// every workspace succeeded and 500 otherwise, always with every workspace's
// result.
func (s *server) serveVerify(w http.ResponseWriter, r *http.Request) {
	started := time.Now()
	out := outcome{log: s.log, message: "replication verify"}
	defer func() { out.write(w, started) }()
	if s.err != nil {
		out.fail(http.StatusInternalServerError, "misconfigured", "the replication service is misconfigured", s.err)
		return
	}
	if r.Method != http.MethodPost && r.Method != http.MethodGet {
		w.Header().Set("Allow", "POST, GET")
		out.fail(http.StatusMethodNotAllowed, "method_not_allowed", "use POST", nil)
		return
	}
	var req verifyRequest
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err == nil && len(body) > 0 {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		out.fail(http.StatusBadRequest, "bad_request", `the body must be empty or {"workspace": "<id>"}`, err)
		return
	}
	var workspaces []string
	if req.Workspace != "" {
		if _, err := s.svc.Workspace(req.Workspace); err != nil {
			out.fail(http.StatusNotFound, "unknown_workspace", "unknown workspace", err)
			return
		}
		workspaces = []string{req.Workspace}
		out.fields = append(out.fields, slog.String("workspace", req.Workspace))
	}
	ctx := context.WithoutCancel(r.Context())
	results := s.svc.VerifyAll(ctx, workspaces, s.verifyBudget, s.sweepBatches)
	failed := 0
	for _, res := range results {
		s.log.Info("replication verify workspace", slog.String("workspace", res.Workspace), slog.String("generation", res.Generation),
			slog.Int("rounds", res.Rounds), slog.Int("checked", res.Checked), slog.Int("verified", res.Verified),
			slog.Int("retried", res.Retried), slog.Int("requeued", res.Requeued), slog.Int("swept", res.Swept), slog.String("error", res.Error))
		if res.Error != "" {
			failed++
		}
	}
	out.fields = append(out.fields, slog.Int("workspaces", len(results)), slog.Int("failed", failed))
	if failed > 0 {
		out.status, out.name, out.body, out.err = http.StatusInternalServerError, "partial_failure", verifyResponse{results}, errors.New("some workspaces failed; see their results")
		return
	}
	out.ok(verifyResponse{results})
}
