package functions

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/logging"
)

// verifyRequest is the Verify function's optional JSON body: one
// workspace, or one shard of the registry (each scheduler job of a sharded
// deployment names its own).
type verifyRequest struct {
	// Workspace limits the run to one workspace; empty means all.
	Workspace string `json:"workspace,omitempty"`
	// Shard and Shards: this run verifies the workspaces whose position in
	// id order is Shard modulo Shards.
	Shard  *int `json:"shard,omitempty"`
	Shards int  `json:"shards,omitempty"`
}

// parseVerifyRequest reads and checks the body: empty, {}, {"workspace":
// …} or {"shard": i, "shards": n}; anything else is an error naming the
// field.
func parseVerifyRequest(body []byte) (verifyRequest, error) {
	var req verifyRequest
	if len(bytes.TrimSpace(body)) == 0 {
		return req, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf("the body must be {}, {\"workspace\": \"<id>\"} or {\"shard\": i, \"shards\": n}: %v", err)
	}
	if dec.More() {
		return req, errors.New("the body must be one JSON object")
	}
	switch {
	case req.Shard != nil && req.Workspace != "":
		return req, errors.New("workspace and shard: give one or the other")
	case req.Shard == nil && req.Shards != 0:
		return req, errors.New("shards without shard")
	case req.Shard != nil && (req.Shards < 1 || req.Shards > 1000):
		return req, fmt.Errorf("shards %d: must be between 1 and 1000", req.Shards)
	case req.Shard != nil && (*req.Shard < 0 || *req.Shard >= req.Shards):
		return req, fmt.Errorf("shard %d: must be between 0 and %d", *req.Shard, req.Shards-1)
	}
	return req, nil
}

// readVerifyRequest reads and parses a verifier call's body (boundBody),
// failing out with the client's status when it cannot: 408 for a body too
// slow, 413 for one too large, 400 otherwise.
func readVerifyRequest(w http.ResponseWriter, r *http.Request, out *outcome) (verifyRequest, bool) {
	body, err := readBody(w, r)
	switch {
	case errors.Is(err, errBodyTooSlow):
		out.fail(http.StatusRequestTimeout, "body_timeout", err.Error(), err)
		return verifyRequest{}, false
	case errors.Is(err, errBodyTooLarge):
		out.fail(http.StatusRequestEntityTooLarge, "body_too_large", err.Error(), err)
		return verifyRequest{}, false
	case err != nil:
		out.fail(http.StatusBadRequest, "bad_request", "the body could not be read", err)
		return verifyRequest{}, false
	}
	req, err := parseVerifyRequest(body)
	if err != nil {
		out.fail(http.StatusBadRequest, "bad_request", err.Error(), err)
		return verifyRequest{}, false
	}
	return req, true
}

// serveVerify is the Verify function, run by Cloud Scheduler every minute
// (the service is private: Cloud Run checks the scheduler's OIDC token, and
// so does this function, see callerCheck). For every workspace, or those
// the body names, it runs verification rounds and then sweeps pending
// events, within the time budget. It answers 200 when every workspace
// succeeded and 500 otherwise, always with every workspace's outcome; what
// went wrong is in the log only.
func (s *server) serveVerify(w http.ResponseWriter, r *http.Request) {
	started := time.Now()
	r = logging.Traced(r)
	boundBody(w, r)
	out := outcome{ctx: r.Context(), log: s.log, message: LogVerify, refusals: &s.refused}
	defer func() { out.write(w, started) }()
	if err := cmp.Or(s.err, s.callerErr); err != nil {
		out.fail(http.StatusInternalServerError, "misconfigured", "the replication service is misconfigured", err)
		out.cause = causeMisconfigured
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		out.fail(http.StatusMethodNotAllowed, "method_not_allowed", "use POST", nil)
		return
	}
	if s.caller != nil {
		if err := s.caller.check(r.Context(), r); err != nil {
			switch {
			case errors.Is(err, errCallerKeysNotFound):
				out.fail(http.StatusServiceUnavailable, "keys_unavailable", "the caller could not be checked now", err)
				out.cause = delivery.CauseKeysUnavailable
			case errors.Is(err, errWrongCaller):
				out.fail(http.StatusForbidden, "forbidden", "forbidden", err)
			default:
				w.Header().Set("WWW-Authenticate", "Bearer")
				out.fail(http.StatusUnauthorized, "unauthorized", "unauthorized", err)
			}
			return
		}
	}
	req, ok := readVerifyRequest(w, r, &out)
	if !ok {
		return
	}
	opts := delivery.VerifyAllOptions{Budget: s.verifyBudget, SweepBatches: s.sweepBatches, Workers: s.verifyWorkers}
	if req.Workspace != "" {
		if _, err := s.svc.Workspace(req.Workspace); err != nil {
			out.fail(http.StatusNotFound, "unknown_workspace", "unknown workspace", err)
			return
		}
		opts.Workspaces = []string{req.Workspace}
		out.fields = append(out.fields, slog.String("workspace", req.Workspace))
	}
	if req.Shard != nil {
		opts.Shard, opts.Shards = *req.Shard, req.Shards
		out.fields = append(out.fields, slog.Int("shard", *req.Shard), slog.Int("shards", req.Shards))
	}
	ctx := context.WithoutCancel(r.Context())
	pass := s.svc.VerifyAll(ctx, opts)
	failed := 0
	for _, res := range pass.Workspaces {
		if res.Outcome == delivery.OutcomeFailed {
			failed++
		}
	}
	out.fields = append(out.fields, slog.Int("workspaces", len(pass.Workspaces)), slog.Int("failed", failed),
		slog.Int("not_reached", len(pass.NotReached)), slog.Int("lookups", pass.Lookups), slog.Int("shared_lookups", pass.SharedLookups))
	// Each workspace's error is on its own log line; the response says
	// only which failed.
	for i := range pass.Workspaces {
		pass.Workspaces[i].Error = ""
	}
	if failed > 0 {
		out.status, out.name, out.body, out.err = http.StatusInternalServerError, "partial_failure", pass, errors.New("some workspaces failed; see their lines")
		out.cause = "workspaces_failed"
		return
	}
	out.ok(pass)
}
