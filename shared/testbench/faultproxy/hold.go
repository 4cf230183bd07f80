package faultproxy

import (
	"context"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Hold is one call the gRPC proxy holds before it forwards it (HoldNext):
// a server that is slow for that call alone, at a moment the caller of
// HoldNext chooses, so that a test can act while the call is held.
type Hold struct {
	match    func(request []byte) bool
	taken    atomic.Bool
	held     chan struct{}
	released chan struct{}
	once     sync.Once
	lost     atomic.Bool
	p        *GRPC
}

// HoldNext holds the next call of a faulted method whose first request
// message (undecoded) match accepts: it is not forwarded until Release
// (or its caller gives up), and then it gets the proxy's fault as any
// call does. One hold is armed at a time: arming another releases the
// one before.
func (p *GRPC) HoldNext(match func(request []byte) bool) *Hold {
	h := &Hold{match: match, held: make(chan struct{}), released: make(chan struct{}), p: p}
	if old := p.hold.Swap(h); old != nil {
		old.Release()
	}
	return h
}

// Held is closed once a call is held.
func (h *Hold) Held() <-chan struct{} { return h.held }

// Release forwards the held call, or disarms the hold if none was held
// yet. It is safe to call more than once.
func (h *Hold) Release() {
	h.once.Do(func() { close(h.released) })
	h.p.hold.CompareAndSwap(h, nil)
}

// Lose lets the held call go as lost on the way: it is never forwarded
// (the server never sees it) and is answered DEADLINE_EXCEEDED, as a call
// whose answer never came; or it disarms the hold if none was held yet.
func (h *Hold) Lose() {
	h.lost.Store(true)
	h.Release()
}

// holdIfMatched holds the call if the armed hold matches its first
// request and holds no call yet; it returns the call's error if its
// caller gave up meanwhile.
func (p *GRPC) holdIfMatched(ctx context.Context, request []byte) error {
	h := p.hold.Load()
	if h == nil || !h.match(request) || !h.taken.CompareAndSwap(false, true) {
		return nil
	}
	p.hold.CompareAndSwap(h, nil)
	close(h.held)
	select {
	case <-h.released:
		if h.lost.Load() {
			p.losses.Add(1)
			return status.Error(codes.DeadlineExceeded, "faultproxy: the held call was lost on the way")
		}
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}
