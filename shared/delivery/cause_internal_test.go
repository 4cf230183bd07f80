package delivery

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/api/googleapi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/segmentstream/ontology-replication/shared/database"
	"github.com/segmentstream/ontology-replication/shared/store"
)

// TestCause: each kind of failure has its cause, the stable label alerts
// group by, however deeply it is wrapped.
func TestCause(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return &pgconn.PgError{Code: code} }
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{fmt.Errorf("%w: %w", errPublish, status.Error(codes.Unavailable, "down")), CausePubSubUnavailable},
		{fmt.Errorf("%w: %w", errPublish, status.Error(codes.NotFound, "no topic")), CausePubSubMisconfigured},
		{fmt.Errorf("%w: %w", errPublish, status.Error(codes.PermissionDenied, "no grant")), CausePubSubMisconfigured},
		{fmt.Errorf("x: %w", database.ErrServerBusy), CauseDatabaseBusy},
		{fmt.Errorf("%w: %w", ErrDrainRetrying, fmt.Errorf("%w: %w", errPublish, status.Error(codes.Unavailable, "down"))), CauseDrainRetrying},
		{ErrShuttingDown, CauseShuttingDown},
		{fmt.Errorf("x: %w", store.ErrTurnWait), CauseTurnHeld},
		{fmt.Errorf("x: %w", store.ErrUnsupportedProtocol), CauseSchema},
		{&googleapi.Error{Code: 403}, CauseWarehouseDenied},
		{&googleapi.Error{Code: 401}, CauseWarehouseDenied},
		{&googleapi.Error{Code: 404}, CauseWarehouseNotFound},
		{&googleapi.Error{Code: 503}, CauseWarehouseUnavailable},
		{pg("55P03"), CauseLockTimeout},
		{pg("57014"), CauseStatementTimeout},
		{pg("40001"), CauseConflict},
		{pg("40P01"), CauseConflict},
		{pg("42P01"), CauseSchema},
		{pg("42501"), CauseDatabaseDenied},
		{pg("28P01"), CauseDatabaseDenied},
		{pg("08006"), CauseDatabaseUnavailable},
		{pg("53300"), CauseDatabaseUnavailable},
		{pg("57P01"), CauseDatabaseUnavailable},
		{pg("23505"), CauseInternal},
		{fmt.Errorf("verify: %w", context.DeadlineExceeded), CauseTimeout},
		{errors.New("something else"), CauseInternal},
	} {
		t.Run(fmt.Sprint(tc.err), func(t *testing.T) {
			if got := Cause(fmt.Errorf("wrapped: %w", tc.err)); tc.err != nil && got != tc.want {
				t.Errorf("Cause(%v) = %q, want %q", tc.err, got, tc.want)
			}
			if tc.err == nil && Cause(nil) != "" {
				t.Errorf("Cause(nil) = %q", Cause(nil))
			}
		})
	}
}
