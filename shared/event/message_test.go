package event_test

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/event"
)

type capturedCase struct {
	History      string `json:"history"`
	Raw          string `json:"raw"`
	Message      string `json:"message"`
	MessageBytes int    `json:"message_bytes"`
}

func loadCaptured(t testing.TB) (source, generation string, cases []capturedCase) {
	t.Helper()
	raw, err := os.ReadFile("testdata/golden.json")
	require.NoError(t, err)
	var g struct {
		Source     string         `json:"source"`
		Generation string         `json:"generation"`
		Captured   []capturedCase `json:"captured"`
	}
	require.NoError(t, json.Unmarshal(raw, &g))
	require.NotEmpty(t, g.Captured)
	return g.Source, g.Generation, g.Captured
}

// TestAppendMessageMatchesTheSDK compares the message built from captured
// jsonb text with what Node.js computes with the SDK's own expression
// (testdata/golden.mjs): key order, a null record_key, numbers, extra keys,
// an index-like key, a forged event_id, and events missing the keys the
// table requires (even {}), which the SDK publishes as they are.
func TestAppendMessageMatchesTheSDK(t *testing.T) {
	t.Parallel()
	source, generation, cases := loadCaptured(t)
	for _, c := range cases {
		t.Run(c.History, func(t *testing.T) {
			got, id, err := event.AppendMessage(nil, []byte(c.Raw), source, c.History, generation)
			require.NoError(t, err)
			require.Equal(t, c.Message, string(got))
			require.Equal(t, event.ID(source, c.History, generation), id)
			require.Equal(t, c.MessageBytes, event.MessageBytes(len(got)))
		})
	}
}

func TestAppendMessageRefusesWhatNoSubscriptionCanWrite(t *testing.T) {
	t.Parallel()
	full := `{"source_id":"s","entity_id":"e","record_key":"k","record_kind":"entity","revision":"7","deleted":false,"schema_hash":"x","payload":"{}"}`
	cases := []struct{ name, raw, want string }{
		{"not json", `{`, "row h"},
		{"trailing garbage", full + `x`, "after the object"},
		{"an array", `[1]`, "not a JSON object"},
		{"a string", `"text"`, "not a JSON object"},
		{"null", `null`, "not a JSON object"},
		{"bad escape", strings.Replace(full, `"x"`, `"\q"`, 1), "bad escape"},
		{"deep", strings.Replace(full, `"{}"`, strings.Repeat("[", 600)+strings.Repeat("]", 600), 1), "nested deeper"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, _, err := event.AppendMessage([]byte("keep"), []byte(c.raw), "s", "h", "g")
			require.ErrorIs(t, err, event.ErrMalformed)
			require.ErrorContains(t, err, c.want)
			require.Equal(t, "keep", string(out), "nothing appended on failure")
		})
	}
	t.Run("any values pass", func(t *testing.T) {
		raw := strings.NewReplacer(`"k"`, "null", `"7"`, "7", `false`, `"no"`).Replace(full)
		out, _, err := event.AppendMessage(nil, []byte(raw), "s", "h", "g")
		require.NoError(t, err)
		require.Contains(t, string(out), `"record_key":null`)
		require.Contains(t, string(out), `"revision":7`)
	})
}

// FuzzAppendMessage checks, for any input, that a built message is valid
// JSON holding the captured keys and values, the target's generation and the
// event's id, and that refused input appends nothing.
func FuzzAppendMessage(f *testing.F) {
	_, _, cases := loadCaptured(f)
	for _, c := range cases {
		f.Add(c.Raw)
	}
	f.Add(`{"a":1}`)
	f.Add(`{"source_id":1,"entity_id":2,"record_key":3,"record_kind":4,"revision":5,"deleted":6,"schema_hash":7,"payload":[1e400,-0.0]}`)
	f.Fuzz(func(t *testing.T, raw string) {
		out, id, err := event.AppendMessage(nil, []byte(raw), "s", "h", "g")
		if err != nil {
			if len(out) != 0 {
				t.Fatalf("refused %q but appended %q", raw, out)
			}
			return
		}
		in, err := decodeNumbers([]byte(raw))
		if err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", raw, err)
		}
		got, err := decodeNumbers(out)
		if err != nil {
			t.Fatalf("message %q of %q is not JSON: %v", out, raw, err)
		}
		if got["generation"] != "g" || got["event_id"] != id {
			t.Fatalf("message %s: generation and event_id not overridden", out)
		}
		for k, v := range in {
			if k == "generation" || k == "event_id" {
				continue
			}
			a, _ := json.Marshal(v)
			b, _ := json.Marshal(got[k])
			if !bytes.Equal(a, b) {
				t.Fatalf("key %q: captured %s, published %s", k, a, b)
			}
		}
		if len(got) != len(in)+2-count(in, "generation", "event_id") {
			t.Fatalf("message %s has other keys than %s", out, raw)
		}
	})
}

// decodeNumbers decodes a JSON object with its numbers as the doubles
// JavaScript reads (nil for one past a double's range, as JSON.stringify
// writes Infinity).
func decodeNumbers(raw []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	return normalise(m).(map[string]any), nil
}

func normalise(v any) any {
	switch x := v.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil || math.IsInf(f, 0) {
			return nil
		}
		if f == 0 {
			return 0.0 // JSON.stringify(-0) is "0"
		}
		return f
	case map[string]any:
		for k, e := range x {
			x[k] = normalise(e)
		}
	case []any:
		for i, e := range x {
			x[i] = normalise(e)
		}
	}
	return v
}

func count(m map[string]any, keys ...string) int {
	n := 0
	for _, k := range keys {
		if _, ok := m[k]; ok {
			n++
		}
	}
	return n
}

// TestAppendMessageAgainstNode runs the SDK's expression in Node.js, when
// it is installed, over inputs the golden file does not hold.
func TestAppendMessageAgainstNode(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed; TestAppendMessageMatchesTheSDK covers the golden cases")
	}
	t.Parallel()
	inputs := []string{
		`{"payload": "x", "deleted": true, "revision": "1", "entity_id": "e", "source_id": "s", "record_key": "k", "record_kind": "entity", "schema_hash": "h"}`,
		`{"0": 0, "01": 1, "4294967294": 2, "4294967295": 3, "-1": 4, "payload": {"z": [0.1, 1e-7, 123456789012345678901234567890, -1.25e-10]}, "deleted": null, "revision": 5e3, "entity_id": "\u00e9\u2028\/", "source_id": "s", "record_key": "k\u001F", "record_kind": "x", "schema_hash": "h"}`,
		`{"payload":"p","deleted":false,"revision":"1","entity_id":"e","source_id":"s","record_key":"k","record_kind":"entity","schema_hash":"h","payload":"last wins"}`,
	}
	script := `const [source, generation] = ["s", "g"];
const { createHash } = require("node:crypto");
const id = (h) => createHash("sha256").update(source + ":" + h + ":" + generation).digest("hex");
for (const raw of JSON.parse(require("fs").readFileSync(0, "utf8"))) {
  console.log(JSON.stringify({ ...JSON.parse(raw), generation, event_id: id("h") }));
}`
	in, err := json.Marshal(inputs)
	require.NoError(t, err)
	cmd := exec.Command(node, "-e", script)
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.Output()
	require.NoError(t, err)
	want := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, want, len(inputs))
	for i, raw := range inputs {
		got, _, err := event.AppendMessage(nil, []byte(raw), "s", "h", "g")
		require.NoError(t, err, raw)
		require.Equal(t, want[i], string(got), raw)
	}
}
