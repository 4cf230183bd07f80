package sandbox

import (
	"encoding/json"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/proto"
)

// PublishLedger is what the components published, as their Pub/Sub
// proxies saw it (each component has its own): for each event, by its wire
// id, the first publish Pub/Sub answered OK, when and by which component;
// and the successful requests by component.
type PublishLedger struct {
	mu       sync.Mutex
	First    map[string]FirstPublish
	requests map[string]int
}

// FirstPublish is an event's first successful publish.
type FirstPublish struct {
	At        time.Time
	Component string
}

// NewPublishLedger returns an empty ledger.
func NewPublishLedger() *PublishLedger {
	return &PublishLedger{First: map[string]FirstPublish{}, requests: map[string]int{}}
}

// observer is a proxy's observer for component (faultproxy.GRPC.Observe):
// it records the events of each Publish answered OK.
func (p *PublishLedger) observer(component string) func(method string, request []byte, ok bool) {
	return func(method string, request []byte, ok bool) {
		if method != publishMethod || !ok {
			return
		}
		now := time.Now()
		ids := PublishedEventIDs(request)
		p.mu.Lock()
		defer p.mu.Unlock()
		p.requests[component]++
		for _, id := range ids {
			if _, seen := p.First[id]; !seen {
				p.First[id] = FirstPublish{At: now, Component: component}
			}
		}
	}
}

// PublishedEventIDs are the event ids (wire ids) a Publish request
// (undecoded) carries; none when it does not decode.
func PublishedEventIDs(request []byte) []string {
	var req pubsubpb.PublishRequest
	if proto.Unmarshal(request, &req) != nil {
		return nil
	}
	ids := make([]string, 0, len(req.Messages))
	for _, m := range req.Messages {
		var body struct {
			EventID string `json:"event_id"`
		}
		if json.Unmarshal(m.Data, &body) == nil && body.EventID != "" {
			ids = append(ids, body.EventID)
		}
	}
	return ids
}

// FirstOf returns an event's first successful publish.
func (p *PublishLedger) FirstOf(eventID string) (FirstPublish, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, ok := p.First[eventID]
	return f, ok
}

// Snapshot copies the first publishes.
func (p *PublishLedger) Snapshot() map[string]FirstPublish {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]FirstPublish, len(p.First))
	for k, v := range p.First {
		out[k] = v
	}
	return out
}
