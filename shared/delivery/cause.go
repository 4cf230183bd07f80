package delivery

import (
	"context"
	"errors"
	"net/http"

	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/api/googleapi"

	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/publish"
	"github.com/segmentstream/ontology-replication/shared/store"
)

// Causes of a failure: the stable `cause` field of the failure lines (a
// drain answering 503 or 500, a workspace a verifier pass could not serve),
// which an alert can group by and an operator can act on without reading
// the error text. Error Reporting groups the ERROR lines by it too.
const (
	CausePubSubUnavailable     = "pubsub_unavailable"     // Pub/Sub refused or timed out: a retry may succeed
	CausePubSubMisconfigured   = "pubsub_misconfigured"   // the topic is missing or may not be published to
	CauseDatabaseUnavailable   = "database_unavailable"   // the connection could not be made or was lost
	CauseDatabaseDenied        = "database_denied"        // the login or a grant was refused
	CauseDatabaseMisconfigured = "database_misconfigured" // the Cloud SQL instance's settings refuse the connection
	CauseDatabaseBusy          = "database_busy"          // the server's connection budget is full
	CauseLockTimeout           = "lock_timeout"           // a lock was not granted within the store's lock timeout
	CauseStatementTimeout      = "statement_timeout"      // a statement ran past the store's statement timeout
	CauseConflict              = "conflict"               // a serialization failure or a deadlock
	CauseSchema                = "schema"                 // the replication schema is missing or at an unknown version
	CauseWarehouseDenied       = "warehouse_denied"       // BigQuery refused the query (a grant revoked, say)
	CauseWarehouseNotFound     = "warehouse_not_found"    // the dataset or table is missing
	CauseWarehouseUnavailable  = "warehouse_unavailable"  // BigQuery failed or throttled: a retry may succeed
	CauseKeysUnavailable       = "keys_unavailable"       // the token issuer's keys could not be fetched
	CauseTurnHeld              = "turn_held"              // the workspace's drain turn was held past the wait's bound
	CauseDrainRetrying         = "drain_retrying"         // the workspace's drainer in this instance backs off after a fault (its line says which)
	CauseShuttingDown          = "shutting_down"          // the instance is stopping: a wake-up is left to another instance or the sweep
	CauseTimeout               = "timeout"                // the work ran out of time
	CauseInternal              = "internal"               // anything else: the error text says what
)

// Cause classifies a failure into one of the Cause* names.
func Cause(err error) string {
	var pgErr *pgconn.PgError
	var apiErr *googleapi.Error
	var connectErr *pgconn.ConnectError
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrDrainRetrying):
		return CauseDrainRetrying
	case errors.Is(err, ErrShuttingDown):
		return CauseShuttingDown
	case errors.Is(err, errPublish) && publish.Misconfigured(err):
		return CausePubSubMisconfigured
	case errors.Is(err, errPublish):
		return CausePubSubUnavailable
	case errors.Is(err, store.ErrTurnWait):
		return CauseTurnHeld
	case errors.Is(err, database.ErrServerBusy):
		return CauseDatabaseBusy
	case errors.Is(err, store.ErrUnsupportedProtocol):
		return CauseSchema
	case errors.As(err, &connectErr):
		// Before a googleapi.Error is taken for BigQuery's: the connector's
		// Admin API answers come wrapped in the connection's error.
		switch {
		case database.LoginRefused(err):
			return CauseDatabaseDenied
		case database.Misconfigured(err):
			return CauseDatabaseMisconfigured
		}
		return CauseDatabaseUnavailable
	case errors.As(err, &apiErr):
		switch {
		case apiErr.Code == http.StatusForbidden || apiErr.Code == http.StatusUnauthorized:
			return CauseWarehouseDenied
		case apiErr.Code == http.StatusNotFound:
			return CauseWarehouseNotFound
		}
		return CauseWarehouseUnavailable
	case errors.As(err, &pgErr):
		code := pgErr.SQLState()
		class := code[:min(2, len(code))]
		switch {
		case code == "55P03":
			return CauseLockTimeout
		case code == "57014":
			return CauseStatementTimeout
		case code == "40001" || code == "40P01":
			return CauseConflict
		case code == "42P01" || code == "42703" || code == "42883":
			return CauseSchema
		case class == "28" || code == "42501":
			return CauseDatabaseDenied
		case class == "08" || class == "53" || class == "57":
			return CauseDatabaseUnavailable
		}
		return CauseInternal
	case errors.Is(err, context.DeadlineExceeded):
		return CauseTimeout
	case store.Retryable(err):
		return CauseDatabaseUnavailable
	}
	return CauseInternal
}
