package cloudsqlproxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// serveAdmin serves the two Admin API calls the connector makes, under
// sql/v1beta4/projects/{project}/instances/{instance}: GET …/connectSettings
// and POST …:generateEphemeralCert, with Google's error shape.
func (i *Instance) serveAdmin(w http.ResponseWriter, r *http.Request) {
	if i.adminDown.Load() {
		apiError(w, http.StatusServiceUnavailable, "backendError", "the Cloud SQL Admin API is unavailable (stand-in)")
		return
	}
	base := fmt.Sprintf("/sql/v1beta4/projects/%s/instances/%s", i.project, i.name)
	path := r.URL.Path
	switch {
	case r.Method == http.MethodGet && path == base+"/connectSettings":
		ips := []map[string]string{{"type": "PRIMARY", "ipAddress": PublicIP}}
		if !i.cfg.PublicOnly {
			ips = append(ips, map[string]string{"type": "PRIVATE", "ipAddress": PrivateIP})
		}
		writeJSON(w, map[string]any{
			"kind":            "sql#connectSettings",
			"serverCaCert":    map[string]any{"kind": "sql#sslCert", "cert": i.caPEM},
			"ipAddresses":     ips,
			"region":          i.region,
			"databaseVersion": "POSTGRES_15",
			"backendType":     "SECOND_GEN",
			"serverCaMode":    "GOOGLE_MANAGED_INTERNAL_CA",
		})
	case r.Method == http.MethodPost && path == base+":generateEphemeralCert":
		var req struct {
			PublicKey   string `json:"public_key"`
			AccessToken string `json:"access_token"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			apiError(w, http.StatusBadRequest, "badRequest", "a JSON body is required")
			return
		}
		// No access token: a certificate of no IAM principal, whose logins
		// must bring a password (which IAM users have none of); one: the
		// certificate of the IAM user the token is the login of.
		user, ok := i.cfg.Users[req.AccessToken]
		if req.AccessToken == "" {
			user, ok = "", !i.tokensRefused.Load()
		}
		if !ok || i.tokensRefused.Load() {
			apiError(w, http.StatusUnauthorized, "authError", "the access token is not one of an IAM principal allowed to log in to "+i.cfg.ConnName+
				" (roles/cloudsql.instanceUser)")
			return
		}
		cert, err := i.issue(req.PublicKey, user)
		if err != nil {
			apiError(w, http.StatusBadRequest, "badRequest", err.Error())
			return
		}
		writeJSON(w, map[string]any{"ephemeralCert": map[string]any{"kind": "sql#sslCert", "cert": cert}})
	default:
		apiError(w, http.StatusNotFound, "notFound", "no such method: "+r.Method+" "+strings.TrimPrefix(path, "/"))
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func apiError(w http.ResponseWriter, status int, reason, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": status, "message": message,
		"errors": []map[string]string{{"reason": reason, "message": message}}}})
}
