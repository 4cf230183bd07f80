package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// Fault is what the gRPC proxy does to a faulted call.
type Fault int32

// The gRPC proxy's faults.
const (
	// Pass forwards the call and its answer.
	Pass Fault = iota
	// Refuse answers UNAVAILABLE without forwarding.
	Refuse
	// Hang accepts the call and never answers it: it is held until the
	// caller gives up, and the server never sees it.
	Hang
	// LoseResponse forwards the call (the server acts on it: a publish is
	// stored) and withholds the answer until the caller gives up.
	LoseResponse
	// Delay holds the call for the proxy's delay (SetDelay), then
	// forwards it: a slow server.
	Delay
	// RefuseBatches answers RESOURCE_EXHAUSTED, without forwarding, to a
	// Publish request that carries more than one message (as a request
	// size limit on the way would), and forwards the others: the requests
	// of one claim then succeed and fail apart.
	RefuseBatches
	// Reject answers INVALID_ARGUMENT without forwarding: the server
	// refusing the request's content, which no retry of the same messages
	// can change (the product sets aside what fails alone).
	Reject
	faultKinds
)

func (f Fault) String() string {
	return [...]string{"pass", "refuse", "hang", "lose_response", "delay", "refuse_batches", "reject"}[f]
}

// GRPC is a transparent gRPC proxy to one backend that puts a fault on the
// calls of the methods it was told to fault. It forwards any method,
// unary or streaming, as raw frames.
type GRPC struct {
	// Addr is the proxy's loopback address (host:port), for
	// PUBSUB_EMULATOR_HOST.
	Addr    string
	backend *grpc.ClientConn
	server  *grpc.Server
	ln      *trackingListener
	faulted func(method string) bool
	fault   atomic.Int32
	delay   atomic.Int64
	counts  [faultKinds]atomic.Int64
	// armed counts the Sets of each fault, resets the Resets: what a
	// harness asked of the proxy, seen by the proxy.
	armed  [faultKinds]atomic.Int64
	resets atomic.Int64
	// losses counts the held calls let go as lost (Hold.Lose).
	losses atomic.Int64
	// observe, when set, sees every finished call (see Observe).
	observe atomic.Pointer[func(method string, request []byte, ok bool)]
	// hold, when set, is the call to hold (see HoldNext).
	hold atomic.Pointer[Hold]
}

// NewGRPC starts a proxy on a free loopback port in front of backend
// (host:port, plaintext). faulted chooses the methods (full names such as
// "/google.pubsub.v1.Publisher/Publish") whose calls get the fault; the
// others always pass.
func NewGRPC(backend string, faulted func(method string) bool) (*GRPC, error) {
	conn, err := grpc.NewClient(backend, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("faultproxy: dial %s: %w", backend, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &GRPC{Addr: ln.Addr().String(), backend: conn, ln: &trackingListener{Listener: ln, conns: map[net.Conn]bool{}}, faulted: faulted}
	p.server = grpc.NewServer(grpc.ForceServerCodecV2(rawCodec{}), grpc.UnknownServiceHandler(p.forward))
	go func() { _ = p.server.Serve(p.ln) }()
	return p, nil
}

// Set makes the faulted methods' calls from now on get f (Pass ends the
// fault; calls already held stay held until their callers give up).
func (p *GRPC) Set(f Fault) {
	if f != Pass {
		p.armed[f].Add(1)
	}
	p.fault.Store(int32(f))
}

// Armed is how many times f was set: a fault set is a fault injected,
// whether or not a call met it (Count).
func (p *GRPC) Armed(f Fault) int64 { return p.armed[f].Load() }

// Resets is how many times Reset was called.
func (p *GRPC) Resets() int64 { return p.resets.Load() }

// Losses is how many held calls were let go as lost (Hold.Lose), never
// forwarded.
func (p *GRPC) Losses() int64 { return p.losses.Load() }

// SetDelay sets how long Delay holds a call.
func (p *GRPC) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Count is how many calls got f so far (for RefuseBatches: how many it
// refused).
func (p *GRPC) Count(f Fault) int64 { return p.counts[f].Load() }

// Observe has fn see every call once it has finished: its method, its first
// request message (undecoded) and whether the backend answered it OK and
// the answer reached the caller.
func (p *GRPC) Observe(fn func(method string, request []byte, ok bool)) { p.observe.Store(&fn) }

// Reset closes every client connection at once with a TCP reset, as a
// network fault does; the calls on them fail and the clients reconnect.
// It returns how many connections it reset.
func (p *GRPC) Reset() int {
	p.resets.Add(1)
	return p.ln.resetAll()
}

// Close stops the proxy.
func (p *GRPC) Close() {
	p.server.Stop()
	p.backend.Close()
}

// forward is the proxy's handler of every method. It reads the caller's
// first message before it chooses what to do, so that a fault may depend on
// it, and forwards it and the rest.
func (p *GRPC) forward(_ any, ss grpc.ServerStream) (err error) {
	method, _ := grpc.MethodFromServerStream(ss)
	var first frame
	if err := ss.RecvMsg(&first); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	ok := false
	if fn := p.observe.Load(); fn != nil {
		defer func() { (*fn)(method, first.data, ok && err == nil) }()
	}
	ctx := ss.Context()
	fault := Pass
	if p.faulted(method) {
		if err := p.holdIfMatched(ctx, first.data); err != nil {
			return err
		}
		fault = Fault(p.fault.Load())
	}
	if fault == RefuseBatches && publishMessages(first.data) <= 1 {
		fault = Pass
	}
	p.counts[fault].Add(1)
	switch fault {
	case Refuse:
		return status.Error(codes.Unavailable, "faultproxy: injected refusal")
	case RefuseBatches:
		return status.Error(codes.ResourceExhausted, "faultproxy: injected: request larger than the limit on the way")
	case Reject:
		return status.Error(codes.InvalidArgument, "faultproxy: injected: the request's content refused")
	case Hang:
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	case Delay:
		t := time.NewTimer(time.Duration(p.delay.Load()))
		select {
		case <-ctx.Done():
			t.Stop()
			return status.FromContextError(ctx.Err()).Err()
		case <-t.C:
		}
	}
	md, _ := metadata.FromIncomingContext(ctx)
	out := metadata.MD{}
	for k, v := range md {
		if !strings.HasPrefix(k, ":") && !strings.HasPrefix(k, "grpc-") && k != "content-type" && k != "user-agent" && k != "te" {
			out[k] = v
		}
	}
	bctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, out))
	defer cancel()
	cs, err := p.backend.NewStream(bctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method, grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		return err
	}
	if first.data != nil {
		if err := cs.SendMsg(&first); err != nil {
			return err
		}
	}
	go pumpRequests(ss, cs)
	if header, err := cs.Header(); err == nil && fault != LoseResponse {
		_ = ss.SendHeader(header)
	}
	for {
		var f frame
		if err := cs.RecvMsg(&f); err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			if fault == LoseResponse {
				<-ctx.Done()
				return status.FromContextError(ctx.Err()).Err()
			}
			ss.SetTrailer(cs.Trailer())
			ok = err == nil
			return err
		}
		if fault == LoseResponse {
			continue
		}
		if err := ss.SendMsg(&f); err != nil {
			return err
		}
	}
}

// publishMessages counts the messages of a Publish request (its field 2),
// reading the protobuf wire format without decoding the messages.
func publishMessages(req []byte) int {
	n := 0
	for len(req) > 0 {
		num, typ, size := protowire.ConsumeTag(req)
		if size < 0 {
			return n
		}
		req = req[size:]
		size = protowire.ConsumeFieldValue(num, typ, req)
		if size < 0 {
			return n
		}
		if num == 2 && typ == protowire.BytesType {
			n++
		}
		req = req[size:]
	}
	return n
}

// pumpRequests copies the caller's frames to the backend.
func pumpRequests(ss grpc.ServerStream, cs grpc.ClientStream) {
	for {
		var f frame
		if err := ss.RecvMsg(&f); err != nil {
			_ = cs.CloseSend()
			return
		}
		if err := cs.SendMsg(&f); err != nil {
			return
		}
	}
}

// frame is one gRPC message, undecoded.
type frame struct{ data []byte }

// rawCodec passes frames through without decoding them. It is given to the
// proxy's server and to its calls only, never registered globally.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(*frame).data)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	v.(*frame).data = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// trackingListener remembers its open connections so that they can be
// reset together.
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns map[net.Conn]bool
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	tracked := &trackedConn{Conn: c, l: l}
	l.conns[tracked] = true
	return tracked, nil
}

func (l *trackingListener) resetAll() int {
	l.mu.Lock()
	conns := make([]net.Conn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	for _, c := range conns {
		if tcp, ok := c.(*trackedConn).Conn.(*net.TCPConn); ok {
			_ = tcp.SetLinger(0) // close with RST, not FIN
		}
		_ = c.Close()
	}
	return len(conns)
}

type trackedConn struct {
	net.Conn
	l    *trackingListener
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}
