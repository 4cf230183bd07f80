package store

import (
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// uuids converts ids in their text form to the uuid[] parameter of the
// store's statements, which pgx sends as 16 bytes each. PostgreSQL's text
// form (36 characters, hyphenated), which is how the store reads ids, is
// parsed by google/uuid without allocating; any other form takes pgx's
// parse, so that exactly the ids pgx accepts are accepted (pgx reads a
// 36-character id without checking its hyphens, which google/uuid does).
func uuids(ids []string) ([]pgtype.UUID, error) {
	out := make([]pgtype.UUID, len(ids))
	for i, id := range ids {
		if len(id) == 36 {
			if u, err := uuid.Parse(id); err == nil {
				out[i] = pgtype.UUID{Bytes: u, Valid: true}
				continue
			}
		}
		if err := out[i].Scan(id); err != nil {
			return nil, fmt.Errorf("id %q is not a uuid: %w", id, err)
		}
	}
	return out, nil
}

// idsJSON is the seed's form of an id list (the legacy statements take it).
func idsJSON(ids []string) string {
	raw, _ := json.Marshal(ids)
	return string(raw)
}
