package functions

import (
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"time"

	"github.com/segmentstream/ontology-replication/shared/delivery"
	"github.com/segmentstream/ontology-replication/shared/identity"
	"github.com/segmentstream/ontology-replication/shared/logging"
)

// The headers the ontology service sends with the wake-up (SDK
// service/replication.js).
const (
	headerIdentity     = "x-segmentstream-runtime-identity"
	headerOrganization = "x-segmentstream-organization-id"
)

// drainPrefix is the start of the drain's path.
const drainPrefix = "/api/internal/v1/workspaces/"

// drainPath matches the path the SDK calls (after whatever prefix a gateway
// keeps): /api/internal/v1/workspaces/{workspace}/ontology/replication/drain.
var drainPath = regexp.MustCompile(`/api/internal/v1/workspaces/([^/]+)/ontology/replication/drain$`)

// serveDrain is the Drain function: authenticate the runtime token, then
// answer at once, the workspace's drainer in this process counting the
// wake-up and draining behind the answer (delivery.Service.Wake). The
// answer says what it promises; what the drainer then publishes is in its
// own line (delivery.LogDrainRun).
func (s *server) serveDrain(w http.ResponseWriter, r *http.Request) {
	started := time.Now()
	r = logging.Traced(r)
	boundBody(w, r) // the wake-up has no body: one announced is never waited for
	out := outcome{ctx: r.Context(), log: s.log, message: LogDrain, refusals: &s.refused}
	defer func() { out.write(w, started) }()
	if s.err != nil {
		out.fail(http.StatusInternalServerError, "misconfigured", "the replication service is misconfigured", s.err)
		out.cause = causeMisconfigured
		return
	}
	m := drainPath.FindStringSubmatch(r.URL.Path)
	if m == nil {
		out.fail(http.StatusNotFound, "not_found", "not found", nil)
		return
	}
	// The path's workspace is the caller's word until the token proves it:
	// logged quoted and cut as requested_workspace, never as the workspace
	// field, which the metrics take their label from.
	workspace := m[1]
	out.fields = append(out.fields, slog.String("requested_workspace", logging.Untrusted(workspace)))
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		out.fail(http.StatusMethodNotAllowed, "method_not_allowed", "use POST", nil)
		return
	}
	if s.verifier == nil {
		out.fail(http.StatusInternalServerError, "misconfigured", "the replication service is misconfigured", errors.New("the registry has no identity section"))
		out.cause = causeMisconfigured
		return
	}
	claims, err := s.verifier.Verify(r.Context(), r.Header.Get(headerIdentity))
	if errors.Is(err, identity.ErrKeysUnavailable) {
		out.fail(http.StatusServiceUnavailable, "unavailable", "temporarily unavailable", err)
		out.cause = delivery.CauseKeysUnavailable
		return
	}
	if err != nil {
		out.fail(http.StatusUnauthorized, "unauthorized", "unauthorized", err)
		return
	}
	// A token valid for one workspace learns nothing about the others: no
	// such workspace and not this token's workspace get the same answer,
	// and only the log tells them apart.
	ws, err := s.svc.Workspace(workspace)
	if err != nil {
		out.fail(http.StatusUnauthorized, "unknown_workspace", "unauthorized", err)
		return
	}
	if err := identity.Authorize(claims, r.Header.Get(headerOrganization), ws); err != nil {
		out.fail(http.StatusUnauthorized, "unauthorized", "unauthorized", err)
		return
	}
	out.fields = append(out.fields, slog.String("workspace", ws.ID))
	ans, err := s.svc.Wake(r.Context(), ws)
	out.fields = append(out.fields, slog.Bool("promised", ans.Promised), slog.Bool("coalesced", ans.Coalesced))
	if err != nil {
		if delivery.Transient(err) {
			out.fail(http.StatusServiceUnavailable, "unavailable", "temporarily unavailable; this commit is left to the drain, which publishes it once it recovers", err)
		} else {
			out.fail(http.StatusInternalServerError, "failed", "delivery failed; see the service's logs", err)
		}
		return
	}
	out.ok(ans)
}

// causeMisconfigured is the cause of a service that cannot serve at all:
// its configuration was refused at start-up.
const causeMisconfigured = "misconfigured"

// Messages of the functions' invocation lines: terraform's log-based metrics
// select them (a test checks that the filters and these agree).
const (
	// LogDrain is a drain invocation's line.
	LogDrain = "replication drain"
	// LogVerify is a verifier pass's line (each workspace has its own,
	// delivery.LogVerifyWorkspace).
	LogVerify = "replication verify"
)
