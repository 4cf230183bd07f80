package store

import (
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
)

// FuzzUUIDs: the store's parse of an id gives the bytes pgx's parse gives,
// and fails exactly when pgx's fails.
func FuzzUUIDs(f *testing.F) {
	for _, s := range []string{
		"9fdf3c47-1500-4294-9175-0aaf6ef21727",
		"00000000-0000-0000-0000-000000000000",
		"ffffffff-ffff-ffff-ffff-ffffffffffff",
		"9FDF3C47-1500-4294-9175-0AAF6EF21727",
		"{9fdf3c47-1500-4294-9175-0aaf6ef21727}",
		"9fdf3c4715004294917 50aaf6ef21727",
		"9fdf3c47150042949175 0aaf6ef21727",
		"9fdf3c47-1500-4294-9175-0aaf6ef2172g",
		"9fdf3c47-1500-4294-9175-0aaf6ef2172",
		"9fdf3c47-15004-294-9175-0aaf6ef21727",
		"9fdf3c47-1500-4294-9175-0aaf6ef217-7", // a hyphen where the last digits are
		"9fdf3c47-1500-4294-9175-0aaf6ef2172-",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var want pgtype.UUID
		wantErr := want.Scan(s)
		got, err := uuids([]string{s})
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("%q: error %v, pgx's %v", s, err, wantErr)
		}
		if err == nil && got[0] != want {
			t.Fatalf("%q: %x, pgx's %x", s, got[0].Bytes, want.Bytes)
		}
	})
}

func BenchmarkUUIDs(b *testing.B) {
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = "9fdf3c47-1500-4294-9175-0aaf6ef21727"
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := uuids(ids); err != nil {
			b.Fatal(err)
		}
	}
}
