package faultproxy_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/segmentstream/ontology-replication/shared/testbench/faultproxy"
)

const topic = "projects/p/topics/t"

// proxied starts a Pub/Sub server (pstest), a proxy in front of it that
// faults Publish, and a publisher client through the proxy, with the
// test's topic created through it (an unfaulted method passes).
func proxied(t *testing.T) (*pstest.Server, *faultproxy.GRPC, pubsubpb.PublisherClient) {
	t.Helper()
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	proxy, err := faultproxy.NewGRPC(srv.Addr, func(m string) bool { return m == "/google.pubsub.v1.Publisher/Publish" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	conn, err := grpc.NewClient(proxy.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := pubsubpb.NewPublisherClient(conn)
	if _, err := client.CreateTopic(t.Context(), &pubsubpb.Topic{Name: topic}); err != nil {
		t.Fatalf("an unfaulted method passes: %v", err)
	}
	return srv, proxy, client
}

// TestGRPCFaults publishes through the proxy with each fault and checks
// what the caller saw and what the server stored.
func TestGRPCFaults(t *testing.T) {
	t.Parallel()
	srv, proxy, client := proxied(t)
	cases := []struct {
		fault  faultproxy.Fault
		code   codes.Code
		stored bool
	}{
		{faultproxy.Pass, codes.OK, true},
		{faultproxy.Refuse, codes.Unavailable, false},
		{faultproxy.Reject, codes.InvalidArgument, false},
		{faultproxy.Hang, codes.DeadlineExceeded, false},
		{faultproxy.LoseResponse, codes.DeadlineExceeded, true},
	}
	for _, c := range cases {
		t.Run(c.fault.String(), func(t *testing.T) {
			proxy.Set(c.fault)
			before := len(srv.Messages())
			ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
			defer cancel()
			_, err := client.Publish(ctx, &pubsubpb.PublishRequest{Topic: topic, Messages: []*pubsubpb.PubsubMessage{{Data: []byte(c.fault.String())}}})
			if got := status.Code(err); got != c.code {
				t.Fatalf("publish with %v: %v, want %v", c.fault, err, c.code)
			}
			if c.fault == faultproxy.LoseResponse {
				// The server stored it before the answer was withheld.
				for len(srv.Messages()) == before {
					time.Sleep(5 * time.Millisecond)
				}
			}
			if stored := len(srv.Messages()) > before; stored != c.stored {
				t.Fatalf("stored %v, want %v", stored, c.stored)
			}
			if proxy.Count(c.fault) == 0 {
				t.Fatalf("the fault was not counted")
			}
			if armed := proxy.Armed(c.fault); c.fault != faultproxy.Pass && armed == 0 {
				t.Fatalf("the fault set was not counted as armed")
			}
		})
	}
	t.Run("reset", func(t *testing.T) {
		proxy.Set(faultproxy.Hang)
		errc := make(chan error, 1)
		go func() {
			_, err := client.Publish(t.Context(), &pubsubpb.PublishRequest{Topic: topic, Messages: []*pubsubpb.PubsubMessage{{Data: []byte("x")}}})
			errc <- err
		}()
		for proxy.Count(faultproxy.Hang) < 2 {
			time.Sleep(5 * time.Millisecond)
		}
		resets := proxy.Resets()
		if n := proxy.Reset(); n == 0 || proxy.Resets() != resets+1 {
			t.Fatalf("%d connections reset, Resets %d then %d: want some, counted once", n, resets, proxy.Resets())
		}
		if err := <-errc; status.Code(err) != codes.Unavailable {
			t.Fatalf("a call on a reset connection: %v, want UNAVAILABLE", err)
		}
		proxy.Set(faultproxy.Pass)
		if _, err := client.Publish(t.Context(), &pubsubpb.PublishRequest{Topic: topic, Messages: []*pubsubpb.PubsubMessage{{Data: []byte("y")}}}); err != nil {
			t.Fatalf("after a reset the client reconnects: %v", err)
		}
	})
}

// TestHTTPFaults checks each fault of the HTTP handler.
func TestHTTPFaults(t *testing.T) {
	t.Parallel()
	h := &faultproxy.HTTP{Next: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }), Hold: time.Minute}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	for _, c := range []struct {
		fault faultproxy.HTTPFault
		code  int
	}{{faultproxy.HTTPPass, http.StatusTeapot}, {faultproxy.HTTPError, http.StatusServiceUnavailable}, {faultproxy.HTTPSlow, 0}, {faultproxy.HTTPFail, http.StatusBadRequest}} {
		t.Run(c.fault.String(), func(t *testing.T) {
			armed := h.Armed(c.fault)
			h.Set(c.fault)
			if c.fault != faultproxy.HTTPPass && h.Armed(c.fault) != armed+1 {
				t.Fatalf("the fault set was not counted as armed")
			}
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			resp, err := srv.Client().Do(req)
			if c.code == 0 {
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("a slow answer: %v, want the client's deadline", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.code {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.code)
			}
		})
	}
}

// TestGRPCBatchFaultsAndObserver: RefuseBatches refuses a Publish of two
// messages and passes one of one; Delay holds a call for the delay before
// forwarding it; the observer sees each call's request and whether it was
// answered OK.
func TestGRPCBatchFaultsAndObserver(t *testing.T) {
	t.Parallel()
	_, proxy, client := proxied(t)
	type call struct {
		messages int
		ok       bool
	}
	calls := make(chan call, 10)
	proxy.Observe(func(method string, request []byte, ok bool) {
		if method != "/google.pubsub.v1.Publisher/Publish" {
			return
		}
		var req pubsubpb.PublishRequest
		if err := proto.Unmarshal(request, &req); err != nil {
			t.Errorf("the observer's request: %v", err)
		}
		calls <- call{len(req.Messages), ok}
	})
	publish := func(n int) error {
		msgs := make([]*pubsubpb.PubsubMessage, n)
		for i := range msgs {
			msgs[i] = &pubsubpb.PubsubMessage{Data: []byte("m")}
		}
		_, err := client.Publish(t.Context(), &pubsubpb.PublishRequest{Topic: topic, Messages: msgs})
		return err
	}
	proxy.Set(faultproxy.RefuseBatches)
	if err := publish(2); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("two messages: %v, want ResourceExhausted", err)
	}
	if c := <-calls; c != (call{2, false}) {
		t.Fatalf("observed %+v", c)
	}
	if err := publish(1); err != nil {
		t.Fatalf("one message passes: %v", err)
	}
	if c := <-calls; c != (call{1, true}) {
		t.Fatalf("observed %+v", c)
	}
	if proxy.Count(faultproxy.RefuseBatches) != 1 {
		t.Fatalf("refused %d, want 1", proxy.Count(faultproxy.RefuseBatches))
	}
	proxy.SetDelay(300 * time.Millisecond)
	proxy.Set(faultproxy.Delay)
	started := time.Now()
	if err := publish(3); err != nil {
		t.Fatalf("a delayed publish passes: %v", err)
	}
	if took := time.Since(started); took < 300*time.Millisecond {
		t.Fatalf("the delayed publish took %v, less than the delay", took)
	}
	if c := <-calls; c != (call{3, true}) {
		t.Fatalf("observed %+v", c)
	}
}

// TestGRPCHoldNext holds the one call its match picks until Release, and
// only that one; Lose ends a held call DEADLINE_EXCEEDED, never forwarded.
func TestGRPCHoldNext(t *testing.T) {
	t.Parallel()
	srv, proxy, client := proxied(t)
	publish := func(data string) error {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err := client.Publish(ctx, &pubsubpb.PublishRequest{Topic: topic, Messages: []*pubsubpb.PubsubMessage{{Data: []byte(data)}}})
		return err
	}
	matches := func(data string) func([]byte) bool {
		return func(request []byte) bool {
			var req pubsubpb.PublishRequest
			return proto.Unmarshal(request, &req) == nil && len(req.Messages) == 1 && string(req.Messages[0].Data) == data
		}
	}
	stored := func(data string) bool {
		for _, m := range srv.Messages() {
			if string(m.Data) == data {
				return true
			}
		}
		return false
	}

	hold := proxy.HoldNext(matches("held"))
	if err := publish("other"); err != nil {
		t.Fatalf("a call the hold does not match passes: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- publish("held") }()
	awaitHeld(t, hold, "the matching call was not held")
	if stored("held") {
		t.Fatal("the held call reached the server before Release")
	}
	if err := publish("held"); err != nil {
		t.Fatalf("a second matching call passes while the first is held: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("the held call ended before Release: %v", err)
	default:
	}
	hold.Release()
	if err := <-done; err != nil || !stored("held") {
		t.Fatalf("after Release the held call gave %v (stored %v), want it forwarded", err, stored("held"))
	}

	disarmed := proxy.HoldNext(matches("late"))
	disarmed.Release()
	if err := publish("late"); err != nil {
		t.Fatalf("a released hold that held nothing holds nothing more: %v", err)
	}
	requireNotHeld(t, disarmed, "a hold released before any call still held one")

	// Arming a hold disarms the one before: its call passes, the new
	// one's is held.
	first := proxy.HoldNext(matches("first"))
	second := proxy.HoldNext(matches("second"))
	if err := publish("first"); err != nil {
		t.Fatalf("the call of a hold armed before another passes: %v", err)
	}
	requireNotHeld(t, first, "a hold re-armed over still held a call")
	go func() { done <- publish("second") }()
	awaitHeld(t, second, "the re-armed hold did not hold its call")
	second.Release()
	if err := <-done; err != nil {
		t.Fatalf("the re-armed hold's call, released: %v", err)
	}

	lost := proxy.HoldNext(matches("lost"))
	go func() { done <- publish("lost") }()
	awaitHeld(t, lost, "the call to lose was not held")
	losses := proxy.Losses()
	lost.Lose()
	if err := <-done; status.Code(err) != codes.DeadlineExceeded || stored("lost") {
		t.Fatalf("a lost call gave %v (stored %v), want DEADLINE_EXCEEDED and never forwarded", err, stored("lost"))
	}
	if proxy.Losses() != losses+1 {
		t.Fatalf("the lost call was not counted: %d, then %d", losses, proxy.Losses())
	}
}

// awaitHeld waits up to 10 s for h to hold a call, or fails naming what.
func awaitHeld(t *testing.T, h *faultproxy.Hold, what string) {
	t.Helper()
	select {
	case <-h.Held():
	case <-time.After(10 * time.Second):
		t.Fatalf("%s within 10 s", what)
	}
}

// requireNotHeld fails, saying why, if h holds a call.
func requireNotHeld(t *testing.T, h *faultproxy.Hold, why string) {
	t.Helper()
	select {
	case <-h.Held():
		t.Fatal(why)
	default:
	}
}
