package publish_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/segmentstream/ontology-replication/shared/publish"
)

const topic = "projects/p1/topics/events"

func newPublisher(t *testing.T, opts ...pstest.ServerReactorOption) (*pstest.Server, *publish.Publisher) {
	t.Helper()
	srv := pstest.NewServer(opts...)
	t.Cleanup(func() { _ = srv.Close() })
	_, err := srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: topic})
	require.NoError(t, err)
	p, err := publish.New(context.Background(), publish.Config{Timeout: 2 * time.Second, Options: []option.ClientOption{
		option.WithEndpoint(srv.Addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return srv, p
}

// counter counts the Publish RPCs the server receives.
type counter struct{ n atomic.Int64 }

func (c *counter) React(any) (bool, any, error) { c.n.Add(1); return false, nil, nil }

func TestPublishOneRequest(t *testing.T) {
	t.Parallel()
	rpcs := &counter{}
	srv, p := newPublisher(t, pstest.ServerReactorOption{FuncName: "Publish", Reactor: rpcs})
	ids, err := p.Publish(context.Background(), topic, [][]byte{[]byte(`{"a":1}`), []byte(`{"b":2}`)})
	require.NoError(t, err)
	require.Len(t, ids, 2)
	msgs := srv.Messages()
	require.Len(t, msgs, 2)
	require.Equal(t, `{"a":1}`, string(msgs[0].Data))
	require.EqualValues(t, 1, rpcs.n.Load(), "one request")
	ids, err = p.Publish(context.Background(), topic, nil)
	require.NoError(t, err)
	require.Empty(t, ids)
}

// failing answers every Publish RPC with an error, counting them.
type failing struct {
	code codes.Code
	n    atomic.Int64
}

func (f *failing) React(any) (bool, any, error) {
	f.n.Add(1)
	return true, nil, status.Error(f.code, "injected")
}

// silent never answers a Publish RPC until released, counting them.
type silent struct {
	n        atomic.Int64
	released chan struct{}
}

func (s *silent) React(any) (bool, any, error) {
	s.n.Add(1)
	<-s.released
	return true, nil, status.Error(codes.Unavailable, "released")
}

// TestPublishErrors: each error of Pub/Sub's is one request (no hidden
// retry: the drain's caller retries by waking it again) and is classified
// for the drain: refused for good, misconfigured, or worth a later try.
func TestPublishErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name                   string
		code                   codes.Code
		rejected, misconfigued bool
	}{
		{"unavailable", codes.Unavailable, false, false},
		{"invalid", codes.InvalidArgument, true, false},
		{"not found", codes.NotFound, false, true},
		{"permission denied", codes.PermissionDenied, false, true},
		{"internal", codes.Internal, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rpcs := &failing{code: c.code}
			srv, p := newPublisher(t, pstest.ServerReactorOption{FuncName: "Publish", Reactor: rpcs})
			_, err := p.Publish(context.Background(), topic, [][]byte{[]byte("x")})
			require.Error(t, err)
			require.EqualValues(t, 1, rpcs.n.Load(), "one request, no hidden retry")
			require.Equal(t, c.rejected, publish.Rejected(err))
			require.Equal(t, c.misconfigued, publish.Misconfigured(err))
			require.Empty(t, srv.Messages())
		})
	}
	t.Run("no answer", func(t *testing.T) {
		t.Parallel()
		rpcs := &silent{released: make(chan struct{})}
		srv, p := newPublisher(t, pstest.ServerReactorOption{FuncName: "Publish", Reactor: rpcs})
		_, err := p.Publish(context.Background(), topic, [][]byte{[]byte("x")})
		require.ErrorContains(t, err, "no answer within 2s")
		require.Equal(t, codes.DeadlineExceeded, status.Code(err))
		require.EqualValues(t, 1, rpcs.n.Load(), "one request, abandoned at the timeout")
		require.False(t, publish.Rejected(err))
		require.False(t, publish.Misconfigured(err))
		close(rpcs.released) // pstest holds its lock while a reactor runs
		require.Empty(t, srv.Messages())
	})
	_, p := newPublisher(t)
	_, err := p.Publish(context.Background(), "projects/p1/topics/missing", [][]byte{[]byte("x")})
	require.True(t, publish.Misconfigured(err), "%v", err)
	_, err = p.Publish(context.Background(), topic, make([][]byte, 1001))
	require.ErrorIs(t, err, publish.ErrTooManyMessages)
	_, err = publish.New(context.Background(), publish.Config{Timeout: time.Hour})
	require.ErrorContains(t, err, "Timeout")
}

func TestPublishEmulatorHost(t *testing.T) {
	srv := pstest.NewServer()
	defer srv.Close()
	_, err := srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: topic})
	require.NoError(t, err)
	t.Setenv("PUBSUB_EMULATOR_HOST", srv.Addr)
	p, err := publish.New(context.Background(), publish.Config{})
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Publish(context.Background(), topic, [][]byte{[]byte("via emulator")})
	require.NoError(t, err)
	require.Len(t, srv.Messages(), 1)
}

func TestPublishEmulatorHostConfig(t *testing.T) {
	t.Parallel()
	srv := pstest.NewServer()
	defer srv.Close()
	_, err := srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: topic})
	require.NoError(t, err)
	p, err := publish.New(context.Background(), publish.Config{EmulatorHost: srv.Addr})
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Publish(context.Background(), topic, [][]byte{[]byte("via config")})
	require.NoError(t, err)
	require.Len(t, srv.Messages(), 1)
}
