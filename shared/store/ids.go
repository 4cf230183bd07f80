package store

import (
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5/pgtype"
)

// uuids converts ids in their text form to the uuid[] parameter of the
// store's statements, which pgx sends as 16 bytes each.
func uuids(ids []string) ([]pgtype.UUID, error) {
	out := make([]pgtype.UUID, len(ids))
	for i, id := range ids {
		if b, ok := parseCanonicalUUID(id); ok {
			out[i] = pgtype.UUID{Bytes: b, Valid: true}
			continue
		}
		// Upper case and the form without hyphens take pgx's slower
		// parse.
		if err := out[i].Scan(id); err != nil {
			return nil, fmt.Errorf("id %q is not a uuid: %w", id, err)
		}
	}
	return out, nil
}

// uuidDigits are the offsets of the 32 hex digits in a uuid's text form.
var uuidDigits = [32]uint8{0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 14, 15, 16, 17,
	19, 20, 21, 22, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35}

// parseCanonicalUUID parses PostgreSQL's text form of a uuid (lower-case
// hex, hyphens after 8, 12, 16 and 20 digits), which is how the store reads
// ids, without allocating.
func parseCanonicalUUID(s string) (u [16]byte, ok bool) {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, false
	}
	for j := range u {
		hi, lo := unhex(s[uuidDigits[2*j]]), unhex(s[uuidDigits[2*j+1]])
		if hi > 15 || lo > 15 {
			return u, false
		}
		u[j] = hi<<4 | lo
	}
	return u, true
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	}
	return 255
}

// idsJSON is the seed's form of an id list (the legacy statements take it).
func idsJSON(ids []string) string {
	raw, _ := json.Marshal(ids)
	return string(raw)
}
