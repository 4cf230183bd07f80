package event_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/event"
)

type golden struct {
	Source     string `json:"source"`
	Generation string `json:"generation"`
	Cases      []struct {
		History      string          `json:"history"`
		Event        json.RawMessage `json:"event"`
		JSON         string          `json:"json"`
		MessageBytes int             `json:"message_bytes"`
	} `json:"cases"`
	Strings []struct {
		S    string `json:"s"`
		JSON string `json:"json"`
	} `json:"strings"`
}

func loadGolden(t testing.TB) golden {
	t.Helper()
	raw, err := os.ReadFile("testdata/golden.json")
	require.NoError(t, err)
	var g golden
	require.NoError(t, json.Unmarshal(raw, &g))
	require.NotEmpty(t, g.Cases)
	return g
}

// The golden file holds what Node.js (the SDK's runtime) computes; see testdata/golden.mjs.
func TestMatchesSDK(t *testing.T) {
	t.Parallel()
	g := loadGolden(t)
	for _, c := range g.Cases {
		t.Run(c.History, func(t *testing.T) {
			var e event.Event
			require.NoError(t, json.Unmarshal(c.Event, &e))
			require.Equal(t, e.EventID, event.ID(g.Source, c.History, g.Generation))
			got := e.AppendJSON(nil)
			require.Equal(t, c.JSON, string(got), "JSON.stringify of the same event")
			require.Equal(t, c.MessageBytes, event.MessageBytes(len(got)))
		})
	}
	for _, s := range g.Strings {
		require.Equal(t, s.JSON, string(event.AppendString(nil, s.S)), "JSON.stringify(%q)", s.S)
	}
}

func TestIDIsSHA256OfSourceHistoryGeneration(t *testing.T) {
	t.Parallel()
	cases := []struct{ source, history, generation string }{
		{"6f1c2a52-8b0e-4d7a-9a51-3c2b1d0e9f84", "00000000-0000-4000-8000-000000000001", "0d9e8c7b-6a5f-4e3d-8c2b-1a0f9e8d7c6b"},
		{"a", "b", "c"},
	}
	for _, c := range cases {
		sum := sha256.Sum256([]byte(c.source + ":" + c.history + ":" + c.generation))
		require.Equal(t, hex.EncodeToString(sum[:]), event.ID(c.source, c.history, c.generation))
	}
}

// jsonBytesFor returns a JSON length whose MessageBytes is exactly n, or -1.
func jsonBytesFor(n int) int {
	for j := 0; j < 4*n; j++ {
		if event.MessageBytes(j) == n {
			return j
		}
		if event.MessageBytes(j) > n {
			return -1
		}
	}
	return -1
}

func TestBatchBound(t *testing.T) {
	t.Parallel()
	t.Run("100-event cap", func(t *testing.T) {
		var b event.SizeBound
		for range event.MaxBatchEvents {
			require.Equal(t, event.Added, b.Offer(10))
		}
		require.Equal(t, event.Full, b.Offer(10))
		require.Equal(t, event.MaxBatchEvents, b.Len())
	})
	t.Run("exactly at the byte bound", func(t *testing.T) {
		// Two events filling the batch to exactly 1,000,000 bytes: both fit.
		first := 499_984 // MessageBytes = 12 + base64 length, a multiple of 4
		j1 := jsonBytesFor(first)
		require.NotEqual(t, -1, j1)
		rest := event.MaxBatchBytes - event.BatchOverhead - first
		j2 := jsonBytesFor(rest)
		require.NotEqual(t, -1, j2)
		var b event.SizeBound
		require.Equal(t, event.Added, b.Offer(j1))
		require.Equal(t, event.Added, b.Offer(j2))
		require.Equal(t, event.MaxBatchBytes, b.Bytes())
		require.Equal(t, event.Full, b.Offer(0), "any further event passes the bound")
	})
	t.Run("one byte past the bound", func(t *testing.T) {
		var b event.SizeBound
		first := 499_984
		require.Equal(t, event.Added, b.Offer(jsonBytesFor(first)))
		rest := event.MaxBatchBytes - event.BatchOverhead - first + 4 // next possible size
		require.Equal(t, event.Full, b.Offer(jsonBytesFor(rest)))
		require.Equal(t, 1, b.Len())
	})
	t.Run("alone at the edge", func(t *testing.T) {
		edge := jsonBytesFor(event.MaxBatchBytes - event.BatchOverhead)
		require.NotEqual(t, -1, edge)
		require.False(t, event.Oversize(edge))
		var b event.SizeBound
		require.Equal(t, event.Added, b.Offer(edge))
		over := edge
		for !event.Oversize(over) {
			over++
		}
		require.Equal(t, event.MaxBatchBytes-event.BatchOverhead+4, event.MessageBytes(over), "the next size past the edge")
		var c event.SizeBound
		require.Equal(t, event.TooLarge, c.Offer(over))
		require.Equal(t, 0, c.Len())
	})
	t.Run("oversize error names the event", func(t *testing.T) {
		err := error(&event.OversizeError{HistoryID: "h1", EventID: "e1", Bytes: 2_000_000})
		var oe *event.OversizeError
		require.True(t, errors.As(err, &oe))
		require.Contains(t, err.Error(), "e1")
		require.Contains(t, err.Error(), "h1")
	})
}

func FuzzAppendString(f *testing.F) {
	g := loadGolden(f)
	for _, s := range g.Strings {
		f.Add(s.S)
	}
	f.Add("\xff\xfe invalid")
	f.Fuzz(func(t *testing.T, s string) {
		out := event.AppendString(nil, s)
		var back string
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("AppendString(%q) = %s is not JSON: %v", s, out, err)
		}
		want := strings.ToValidUTF8(s, "\uFFFD")
		// Go's decoder replaces each invalid byte separately; compare runes of valid input only.
		if want == s && back != s {
			t.Fatalf("round trip of %q gave %q", s, back)
		}
		// Go's encoder differs from JSON.stringify only in escaping <, >, &, U+2028 and U+2029.
		std, _ := json.Marshal(want)
		norm := strings.NewReplacer(`\u003c`, "<", `\u003e`, ">", `\u0026`, "&", `\u2028`, "\u2028", `\u2029`, "\u2029", `\u0008`, `\b`, `\u000c`, `\f`).Replace(string(std))
		if want == s && norm != string(out) {
			t.Fatalf("AppendString(%q) = %s, encoding/json (normalised) %s", s, out, norm)
		}
	})
}

func FuzzEventSize(f *testing.F) {
	f.Add("k", "{}", "1", false)
	f.Add(strings.Repeat("x", 300), `{"a":"<&>"}`, "9223372036854775807", true)
	f.Fuzz(func(t *testing.T, key, payload, revision string, deleted bool) {
		e := event.Event{EventID: "id", SourceID: "s", Generation: "g", EntityID: "e", RecordKey: key,
			RecordKind: "entity", Revision: revision, Deleted: deleted, SchemaHash: "h", Payload: payload}
		js := e.AppendJSON(nil)
		if !json.Valid(js) {
			t.Fatalf("invalid JSON %s", js)
		}
		msg, _ := json.Marshal(map[string]string{"data": base64.StdEncoding.EncodeToString(js)})
		if got, want := event.MessageBytes(len(js)), len(msg)+1; got != want {
			t.Fatalf("MessageBytes = %d, want %d", got, want)
		}
		var b event.SizeBound
		fit := b.Offer(len(js))
		if (fit == event.TooLarge) != event.Oversize(len(js)) {
			t.Fatalf("Offer = %v, Oversize = %v", fit, event.Oversize(len(js)))
		}
		if fit == event.Added && b.Bytes() > event.MaxBatchBytes {
			t.Fatalf("batch of %d bytes passed the bound", b.Bytes())
		}
	})
}
