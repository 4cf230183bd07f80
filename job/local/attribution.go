package main

import (
	"encoding/json"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/proto"
)

// publishLedger is what the components published, as their Pub/Sub
// proxies saw it (each component has its own): for each event, by its wire
// id, the first publish Pub/Sub answered OK, when and by which component;
// and the successful requests by component.
type publishLedger struct {
	mu       sync.Mutex
	first    map[string]firstPublish
	requests map[string]int
}

// firstPublish is an event's first successful publish.
type firstPublish struct {
	At        time.Time
	Component string
}

func newPublishLedger() *publishLedger {
	return &publishLedger{first: map[string]firstPublish{}, requests: map[string]int{}}
}

// observer is a proxy's observer for component (faultproxy.GRPC.Observe):
// it records the events of each Publish answered OK.
func (p *publishLedger) observer(component string) func(method string, request []byte, ok bool) {
	return func(method string, request []byte, ok bool) {
		if method != publishMethod || !ok {
			return
		}
		now := time.Now()
		ids := publishedEventIDs(request)
		p.mu.Lock()
		defer p.mu.Unlock()
		p.requests[component]++
		for _, id := range ids {
			if _, seen := p.first[id]; !seen {
				p.first[id] = firstPublish{At: now, Component: component}
			}
		}
	}
}

// publishedEventIDs are the event ids (wire ids) a Publish request
// (undecoded) carries; none when it does not decode.
func publishedEventIDs(request []byte) []string {
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

// firstOf returns an event's first successful publish.
func (p *publishLedger) firstOf(eventID string) (firstPublish, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, ok := p.first[eventID]
	return f, ok
}

// snapshot copies the first publishes.
func (p *publishLedger) snapshot() map[string]firstPublish {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]firstPublish, len(p.first))
	for k, v := range p.first {
		out[k] = v
	}
	return out
}
