package localwarehouse

import (
	"testing"

	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
)

func TestTranslate(t *testing.T) {
	params := map[string]bqserver.Param{
		"ids":    {Type: "ARRAY", ArrayType: "STRING", Values: []string{"a"}},
		"digits": {Type: "INT64", Value: "3"},
		"since":  {Type: "TIMESTAMP", Value: "2026-12-03T00:00:00Z"},
	}
	for _, tc := range []struct{ name, in, want string }{
		{"table and unnest", "SELECT event_id FROM `p.d.t` WHERE event_id IN UNNEST(@ids)",
			"SELECT event_id FROM events WHERE event_id = ANY($1::text[])"},
		{"nested casts", "CAST(CAST(latest AS INT64) AS STRING)", "bq_string(bq_int64(latest))"},
		{"cast of a call", "CAST(CONCAT('0x', SUBSTR(x, 1, @digits)) AS INT64)", "bq_int64(CONCAT('0x', SUBSTR(x, 1, $1::bigint)))"},
		{"subqueries named", "SELECT a FROM (SELECT a FROM (SELECT 1 AS a)) WHERE a = 1",
			"SELECT a FROM (SELECT a FROM (SELECT 1 AS a) AS sub1) AS sub0 WHERE a = 1"},
		{"one position per name", "@digits + @digits", "$1::bigint + $1::bigint"},
		{"partition filter", "_PARTITIONTIME >= TIMESTAMP_TRUNC(@since, DAY)", "ingested_at >= date_trunc('day', $1::timestamptz)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := translate(tc.in, params)
			if err != nil || got != tc.want {
				t.Errorf("translate(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
	for _, bad := range []string{"CAST(x AS FLOAT64)", "@nosuch", "CAST(x"} {
		if _, _, err := translate(bad, params); err == nil {
			t.Errorf("translate(%q) accepted", bad)
		}
	}
}

// FuzzTranslate: the rewriting never panics, whatever the text.
func FuzzTranslate(f *testing.F) {
	for _, s := range []string{"CAST(CAST(a AS INT64) AS STRING)", "FROM (FROM (", "CAST(", "@ids IN UNNEST(@ids)", "`x`"} {
		f.Add(s)
	}
	params := map[string]bqserver.Param{"ids": {Type: "ARRAY", ArrayType: "STRING"}}
	f.Fuzz(func(t *testing.T, s string) { _, _, _ = translate(s, params) })
}
