package delivery

import (
	"sync"

	"google.golang.org/grpc/codes"

	"github.com/segmentstream/ontology-replication/shared/store"
)

// Events whose publish fails for a reason of their own: the package doc
// ("Events whose publish fails alone") has the rule this file keeps.

// suspectFailures is how many counted failures set an event aside.
const suspectFailures = 3

// maxSuspects bounds the suspects a process keeps; past it the oldest
// marks are forgotten (a forgotten event is suspected again when its
// request fails again).
const maxSuspects = 4096

// suspects is this process's suspected events, by generation and history
// id, and what it knows of each topic's requests.
type suspects struct {
	mu sync.Mutex
	// topics are the request counts by topic: whether "Pub/Sub takes other
	// events" is judged on the event's own topic, never on another
	// workspace's.
	topics map[string]*topicRequests
	events map[string]*suspect
	order  []string // keys in the order they were first suspected
}

// topicRequests counts one topic's requests of this process: the
// successful ones, the failed ones (neither refused nor misconfigured),
// and published at the last failure (failedAfter).
type topicRequests struct {
	published, failed, failedAfter uint64
}

// failure is what a failed request saw: the failures of its topic counted
// with it, and its topic's published at the failure before it.
type failure struct{ n, publishedBefore uint64 }

// topic returns a topic's counts. ss.mu is held.
func (ss *suspects) topic(name string) *topicRequests {
	if ss.topics == nil {
		ss.topics = map[string]*topicRequests{}
	}
	t, ok := ss.topics[name]
	if !ok {
		t = &topicRequests{}
		ss.topics[name] = t
	}
	return t
}

// published counts a successful request to topic.
func (ss *suspects) published(topic string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.topic(topic).published++
}

// publishedTo is how many requests to topic succeeded.
func (ss *suspects) publishedTo(topic string) uint64 {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.topic(topic).published
}

// noteFailure counts a failed request to topic.
func (ss *suspects) noteFailure(topic string) failure {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	t := ss.topic(topic)
	f := failure{n: t.failed + 1, publishedBefore: t.failedAfter}
	t.failed, t.failedAfter = f.n, t.published
	return f
}

// neverTheEvents reports the codes of failures that are never an event's
// own: Pub/Sub (or the way to it) unavailable or out of time, a request
// cancelled or aborted, a credential refused. They never count against an
// event, never make it a suspect, and are never a reason to probe: one
// event on a quiet workspace meets them as any batch does.
func neverTheEvents(code codes.Code) bool {
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted, codes.Unauthenticated:
		return true
	}
	return false
}

// suspect is one suspected event.
type suspect struct {
	failures int        // failures of it alone in a row
	code     codes.Code // their code
	// since is published at the request failure before the first of
	// them, and last the failure count at the last of them.
	since, last uint64
	// aside is the set-aside the failures decided, until a finish wrote
	// it (written): when the batch's claim is lost before (its session
	// ended), the event comes back pending and is set aside again on
	// this evidence, with no fourth publish.
	aside *store.SetAside
}

func suspectKey(generation, historyID string) string { return generation + "/" + historyID }

// isSuspect reports whether an event is to be published alone.
func (ss *suspects) isSuspect(generation, historyID string) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	_, ok := ss.events[suspectKey(generation, historyID)]
	return ok
}

// worthProbing reports whether a lone event's failure f on topic is worth
// the claim beside it (Service.probe): f is the topic's first failure,
// Pub/Sub took a request to the topic since the failure before, or that
// failure was this event's own (no other request to the topic failed in
// between: again is failedAlone's). During an outage, when the other
// requests fail too, it is not.
func (ss *suspects) worthProbing(topic string, f failure, again bool) bool {
	return f.n == 1 || again || ss.publishedTo(topic) > f.publishedBefore
}

// mark suspects the largest of the events a failed request carried.
func (ss *suspects) mark(generation string, events []store.Pending) {
	if len(events) < 2 {
		return
	}
	largest := events[0]
	for _, e := range events[1:] {
		if len(e.JSON) > len(largest.JSON) {
			largest = e
		}
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.entry(suspectKey(generation, largest.HistoryID))
}

// entry returns an event's record, making one (and forgetting the oldest
// past maxSuspects) when there is none. ss.mu is held.
func (ss *suspects) entry(key string) *suspect {
	if sp, ok := ss.events[key]; ok {
		return sp
	}
	if ss.events == nil {
		ss.events = map[string]*suspect{}
	}
	for len(ss.events) >= maxSuspects && len(ss.order) > 0 {
		delete(ss.events, ss.order[0])
		ss.order = ss.order[1:]
	}
	sp := &suspect{}
	ss.events[key] = sp
	ss.order = append(ss.order, key)
	return sp
}

// failedAlone records a failed publish of one event alone to topic (f, as
// noteFailure counted it; its code is one that may be the event's own:
// see neverTheEvents) and reports whether the event is now to be set
// aside, and whether the failure before f was this event's own (again).
func (ss *suspects) failedAlone(topic, generation, historyID string, code codes.Code, f failure) (setAside, again bool) {
	key := suspectKey(generation, historyID)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	sp := ss.entry(key)
	again = sp.failures > 0 && f.n == sp.last+1
	if !again || sp.code != code {
		sp.failures, sp.code, sp.since = 0, code, f.publishedBefore
	}
	sp.failures++
	sp.last = f.n
	if sp.failures < suspectFailures || ss.topic(topic).published == sp.since {
		return false, again
	}
	return true, again
}

// decide records that an event is to be set aside so (failedAlone said
// it), until a finish writes it.
func (ss *suspects) decide(generation string, aside store.SetAside) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.entry(suspectKey(generation, aside.HistoryID)).aside = &aside
}

// decided returns the set-aside decided for an event and not yet written.
func (ss *suspects) decided(generation, historyID string) (store.SetAside, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if sp, ok := ss.events[suspectKey(generation, historyID)]; ok && sp.aside != nil {
		return *sp.aside, true
	}
	return store.SetAside{}, false
}

// written forgets the events a finish set aside: their records are done.
func (ss *suspects) written(generation string, aside []store.SetAside) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, a := range aside {
		ss.forgetLocked(suspectKey(generation, a.HistoryID))
	}
}

// forget drops an event published or refused.
func (ss *suspects) forget(generation, historyID string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.forgetLocked(suspectKey(generation, historyID))
}

func (ss *suspects) forgetLocked(key string) {
	if _, ok := ss.events[key]; !ok {
		return
	}
	delete(ss.events, key)
	for i, k := range ss.order {
		if k == key {
			ss.order = append(ss.order[:i], ss.order[i+1:]...)
			break
		}
	}
}
