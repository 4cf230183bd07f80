package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Protocol versions of the replication schema.
const (
	// ProtocolLegacy (3, SDK 0.12 and later) finds pending events by scanning
	// baselines and history tables minus receipts.
	ProtocolLegacy = 3
	// ProtocolDelivery (4, SDK 0.25 and later) keeps an indexed delivery queue.
	ProtocolDelivery = 4
)

// State is the replication singleton (_ontology_replication).
type State struct {
	// Version is the database's replication protocol: 3 or 4.
	Version int
	// Enabled reports whether capture is on.
	Enabled bool
	// SourceID is the current replication source.
	SourceID string
	// ActiveGeneration is the active target's generation, "" when none.
	ActiveGeneration string
}

// Selection is one selected entity of a target (the SDK's
// ReplicationSelection): the entity id, its replicated fields and its
// replicated many-relationships.
type Selection struct {
	EntityID      string   `json:"entityId"`
	Fields        []string `json:"fields"`
	Relationships []string `json:"relationships,omitempty"`
}

// Target is one generation's replication target
// (_ontology_replication_targets).
type Target struct {
	Generation   string
	SourceID     string
	FromRevision int64
	// Manifest is the ontology manifest the generation was started with.
	Manifest json.RawMessage
	// Selection is what the generation replicates.
	Selection []Selection
	// Protocol is the protocol the target was created under (3 on legacy
	// databases, where the column does not exist).
	Protocol int
	// DeliveryVersion is 4 when the database is at protocol 4 (the seed's
	// "4 AS delivery_version"), 3 otherwise. It chooses the delivery-queue or
	// the legacy paths.
	DeliveryVersion int

	// The fields below are only read at protocol 4.

	BaselineComplete bool
	BaselineCursor   json.RawMessage
	BackfillComplete bool
	BackfillCursor   json.RawMessage
	BackfillRevision *int64
	InitialRevision  *int64
	ReplayComplete   bool
	ReplayCursor     *string
	VerifiedCount    int64
}

// The seed switches between its protocol-4 and legacy statements by two
// rules, each written once here:
//
//   - UsesDelivery, for what reads a target's events and figures
//     (pendingReplicationEvents, replicationStatus,
//     unverifiedReplicationEvents, replicationInitiallyReady): the target's
//     delivery_version === 4 || protocol === 4;
//   - DatabaseAtDelivery, for what writes their state (acknowledgeReplication,
//     verifyReplicationEvents, retryUnverifiedReplication, replayReplication)
//     and for the backfill, which needs the delivery table: the database's
//     protocol() >= 4.
//
// They differ only for a target of protocol 4 in a database whose
// singleton says 3, which no SDK migration produces.

// UsesDelivery reports whether the target's events are read from the
// delivery queue (protocol 4) rather than the legacy scan.
func (t Target) UsesDelivery() bool {
	return t.DeliveryVersion == ProtocolDelivery || t.Protocol == ProtocolDelivery
}

// DatabaseAtDelivery reports whether the target's database is at protocol 4
// or later, where event state is written to the delivery queue.
func (t Target) DatabaseAtDelivery() bool {
	return t.DeliveryVersion >= ProtocolDelivery
}

// sqlSchemaPresent checks for the singleton table, as the SDK does before
// touching it (beginReplicationWrite, service-binding.js).
const sqlSchemaPresent = `SELECT to_regclass('_ontology_replication') IS NOT NULL AS present`

// sqlState reads the singleton; protocol() in store.js reads its version.
const sqlState = `SELECT version, enabled, source_id::text, active_generation::text FROM _ontology_replication WHERE id`

// sqlClaimState is a claim's read of the replication state at protocol 4:
// the singleton (protocol() and the active generation, as sqlState) and,
// in the same statement, what the claim needs of the active target — its
// generation and source, which every message carries (the seed's
// replicationTarget reads the whole row, manifest and selection included,
// which a claim never uses: at the drain's rate of claims that was most of
// what the state's two statements cost). A database at protocol 3 has the
// same two columns; its claim's candidates' statement is what cannot be
// prepared there (see settleProtocol).
const sqlClaimState = `SELECT s.version, s.enabled, s.source_id::text, s.active_generation::text, t.generation::text, t.source_id::text
  FROM _ontology_replication s LEFT JOIN _ontology_replication_targets t ON t.generation = s.active_generation
 WHERE s.id`

// readClaimState scans sqlClaimState: the state, and the active target as
// a claim knows it: its generation and source, the database at protocol
// 4 (DeliveryVersion). No active target is ErrNoActiveTarget, with the state.
func readClaimState(row pgx.Row) (State, Target, error) {
	var state State
	var active, generation, source *string
	err := row.Scan(&state.Version, &state.Enabled, &state.SourceID, &active, &generation, &source)
	if errors.Is(err, pgx.ErrNoRows) {
		return State{}, Target{}, ErrNoSchema
	}
	if err != nil {
		return State{}, Target{}, err
	}
	if state.Version != ProtocolLegacy && state.Version != ProtocolDelivery {
		return State{}, Target{}, fmt.Errorf("%w: the database is at version %d; this release speaks 3 and 4", ErrUnsupportedProtocol, state.Version)
	}
	if active != nil {
		state.ActiveGeneration = *active
	}
	if generation == nil || source == nil {
		return state, Target{}, ErrNoActiveTarget
	}
	return state, Target{Generation: *generation, SourceID: *source, DeliveryVersion: ProtocolDelivery}, nil
}

// sqlTargetFieldsV4 is targetFields of store.js (seed 000), plus the cursors,
// backfill revision and verified count that status reports.
const sqlTargetFieldsV4 = `generation::text, source_id::text, from_revision, manifest, selection,
  protocol, baseline_complete, backfill_complete, initial_revision, replay_complete, 4 AS delivery_version,
  baseline_cursor, backfill_cursor, backfill_revision, replay_cursor::text, verified_count`

// sqlTargetFieldsV3 is the legacy target projection of store.js.
const sqlTargetFieldsV3 = `generation::text, source_id::text, from_revision, manifest, selection,
  3 AS protocol, true, true, NULL::bigint, true, 3 AS delivery_version,
  '{}'::jsonb, '{}'::jsonb, NULL::bigint, NULL::text, 0::bigint`

// sqlActiveTarget is activeReplicationTarget (seed 000).
const (
	sqlActiveTargetV4 = `SELECT ` + sqlTargetFieldsV4 + ` FROM _ontology_replication_targets
     WHERE generation = (SELECT active_generation FROM _ontology_replication WHERE id)`
	sqlActiveTargetV3 = `SELECT ` + sqlTargetFieldsV3 + ` FROM _ontology_replication_targets
     WHERE generation = (SELECT active_generation FROM _ontology_replication WHERE id)`
)

// sqlTarget is replicationTarget (seed 000).
const (
	sqlTargetV4 = `SELECT ` + sqlTargetFieldsV4 + ` FROM _ontology_replication_targets WHERE generation = $1::uuid`
	sqlTargetV3 = `SELECT ` + sqlTargetFieldsV3 + ` FROM _ontology_replication_targets WHERE generation = $1::uuid`
)

// State reads the replication singleton. It returns ErrNoSchema when the
// replication schema is missing and ErrUnsupportedProtocol for a version
// other than 3 or 4.
func (s *Store) State(ctx context.Context) (State, error) {
	var state State
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		state, err = readState(ctx, tx)
		return err
	})
	if err != nil {
		return State{}, fmt.Errorf("store: read replication state: %w", err)
	}
	return state, nil
}

func readState(ctx context.Context, tx pgx.Tx) (State, error) {
	var present bool
	if err := tx.QueryRow(ctx, sqlSchemaPresent).Scan(&present); err != nil {
		return State{}, err
	}
	if !present {
		return State{}, ErrNoSchema
	}
	return readStateRow(tx.QueryRow(ctx, sqlState))
}

// readStateRow scans and checks the singleton.
func readStateRow(row pgx.Row) (State, error) {
	var state State
	var active *string
	err := row.Scan(&state.Version, &state.Enabled, &state.SourceID, &active)
	if errors.Is(err, pgx.ErrNoRows) {
		return State{}, ErrNoSchema
	}
	if err != nil {
		return State{}, err
	}
	if state.Version != ProtocolLegacy && state.Version != ProtocolDelivery {
		return State{}, fmt.Errorf("%w: the database is at version %d; this release speaks 3 and 4", ErrUnsupportedProtocol, state.Version)
	}
	if active != nil {
		state.ActiveGeneration = *active
	}
	return state, nil
}

// ActiveTarget returns the singleton and its active target; the target is
// ErrNoActiveTarget when replication has never been started.
func (s *Store) ActiveTarget(ctx context.Context) (State, Target, error) {
	var state State
	var t Target
	err := s.inTx(ctx, func(tx pgx.Tx) (err error) {
		state, t, err = activeTargetIn(ctx, tx)
		return err
	})
	if err != nil {
		return state, Target{}, fmt.Errorf("store: read active target: %w", err)
	}
	return state, t, nil
}

// activeTargetIn reads the replication state and the active target in tx
// (ErrNoActiveTarget when there is none).
func activeTargetIn(ctx context.Context, tx pgx.Tx) (State, Target, error) {
	state, err := readState(ctx, tx)
	if err != nil {
		return state, Target{}, err
	}
	q := sqlActiveTargetV3
	if state.Version >= ProtocolDelivery {
		q = sqlActiveTargetV4
	}
	t, err := scanTarget(tx.QueryRow(ctx, q))
	if errors.Is(err, pgx.ErrNoRows) {
		return state, Target{}, ErrNoActiveTarget
	}
	return state, t, err
}

// Target returns the target of a generation, or ErrUnknownGeneration.
func (s *Store) Target(ctx context.Context, generation string) (Target, error) {
	var t Target
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		state, err := readState(ctx, tx)
		if err != nil {
			return err
		}
		t, err = readTarget(ctx, tx, state.Version, generation)
		return err
	})
	if err != nil {
		return Target{}, fmt.Errorf("store: read target %s: %w", generation, err)
	}
	return t, nil
}

func readTarget(ctx context.Context, tx pgx.Tx, version int, generation string) (Target, error) {
	if !isUUID(generation) {
		return Target{}, fmt.Errorf("%w: %q is not a uuid", ErrUnknownGeneration, generation)
	}
	q := sqlTargetV3
	if version >= ProtocolDelivery {
		q = sqlTargetV4
	}
	t, err := scanTarget(tx.QueryRow(ctx, q, generation))
	if errors.Is(err, pgx.ErrNoRows) {
		return Target{}, ErrUnknownGeneration
	}
	return t, err
}

func scanTarget(row pgx.Row) (Target, error) {
	var t Target
	var selection []byte
	err := row.Scan(&t.Generation, &t.SourceID, &t.FromRevision, &t.Manifest, &selection,
		&t.Protocol, &t.BaselineComplete, &t.BackfillComplete, &t.InitialRevision, &t.ReplayComplete, &t.DeliveryVersion,
		&t.BaselineCursor, &t.BackfillCursor, &t.BackfillRevision, &t.ReplayCursor, &t.VerifiedCount)
	if err != nil {
		return Target{}, err
	}
	if err := json.Unmarshal(selection, &t.Selection); err != nil {
		return Target{}, fmt.Errorf("target %s: selection is not a list of entity selections: %w", t.Generation, err)
	}
	return t, nil
}

// isUUID reports whether s is a uuid in any of PostgreSQL's accepted
// hyphenated forms, so that a bad generation is a clear error rather than a
// SQL cast failure.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f', c >= 'A' && c <= 'F':
		default:
			return false
		}
	}
	return true
}
