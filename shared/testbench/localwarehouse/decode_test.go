package localwarehouse

import (
	"encoding/json"
	"testing"

	"github.com/segmentstream/ontology-replication/shared/event"
)

// FuzzDecode: any message either fits the table schema, with every
// required column set, or is refused with ErrRejected; never a panic.
func FuzzDecode(f *testing.F) {
	e := event.Event{EventID: "e", SourceID: "s", Generation: "g", EntityID: "ent", RecordKey: "k", RecordKind: "entity",
		Revision: "12", SchemaHash: "h", Payload: `{"id":"k"}`}
	f.Add(e.AppendJSON(nil))
	f.Add([]byte(`{"event_id":"x"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decode(data)
		if err != nil {
			return
		}
		for _, field := range event.TableSchema {
			if _, ok := r.values[field.Name]; !ok && field.Mode == "REQUIRED" {
				t.Fatalf("accepted %s without %s", data, field.Name)
			}
		}
		if !json.Valid([]byte(r.values["payload"].(string))) {
			t.Fatalf("accepted a payload that is not JSON: %s", data)
		}
	})
}
