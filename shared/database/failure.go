package database

import (
	"errors"
	"fmt"
	"net/http"

	"cloud.google.com/go/cloudsqlconn/errtype"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/api/googleapi"
)

// LoginRefused reports whether err is a connection refused for who logs
// in, which no retry mends: PostgreSQL's invalid authorization (SQLSTATE
// class 28: a password or an IAM login refused, a role that does not exist
// or may not log in), or, for a Cloud SQL database, the Admin API refusing
// the connector its ephemeral certificate (401 or 403: the IAM token is not
// accepted, or the service account lacks roles/cloudsql.client or
// roles/cloudsql.instanceUser on the instance's project).
func LoginRefused(err error) bool {
	if err == nil {
		return false
	}
	var connectErr *pgconn.ConnectError
	if !errors.As(err, &connectErr) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(connectErr.Unwrap(), &pgErr) {
		code := pgErr.SQLState()
		return len(code) >= 2 && code[:2] == "28"
	}
	code := adminAPIStatus(connectErr.Unwrap())
	return code == http.StatusUnauthorized || code == http.StatusForbidden
}

// Misconfigured reports a Cloud SQL connection that the instance's own
// settings refuse, which no retry mends either: the connector's
// configuration errors (a private IP asked of an instance without one, a
// region that is not the instance's) or the Admin API not knowing the
// instance (404).
func Misconfigured(err error) bool {
	var configErr *errtype.ConfigError
	if errors.As(err, &configErr) {
		return true
	}
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr) && adminAPIStatus(connectErr.Unwrap()) == http.StatusNotFound
}

// adminAPIStatus is the HTTP status of the Cloud SQL Admin API's answer
// that failed the connector's refresh, or 0.
func adminAPIStatus(err error) int {
	var refreshErr *errtype.RefreshError
	var apiErr *googleapi.Error
	if errors.As(err, &refreshErr) && errors.As(refreshErr, &apiErr) {
		return apiErr.Code
	}
	return 0
}

// explainCloudSQL says, of a connector's failure to dial instance as user,
// what an operator checks: the IAM roles of a refused login, the instance
// of one not found, the registry's private_ip of a configuration refused.
// Other failures (the Admin API or the instance unavailable) are as the
// connector tells them.
func explainCloudSQL(err error, instance, user string) error {
	var configErr *errtype.ConfigError
	switch code := adminAPIStatus(err); {
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return fmt.Errorf("the Cloud SQL Admin API refused %s an ephemeral certificate for %s (HTTP %d): its service account needs roles/cloudsql.client and roles/cloudsql.instanceUser in the instance's project: %w",
			user, instance, code, err)
	case code == http.StatusNotFound:
		return fmt.Errorf("no Cloud SQL instance %s that this service account can see (the registry's database.instance, and the Cloud SQL Admin API enabled in its project): %w", instance, err)
	case errors.As(err, &configErr):
		return fmt.Errorf("the Cloud SQL instance %s refuses this connection as the registry configures it (private_ip without a private IP, say): %w", instance, err)
	}
	return err
}
