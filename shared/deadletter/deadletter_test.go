package deadletter_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/segmentstream/ontology-replication/shared/deadletter"
)

const sub = "projects/p1/subscriptions/dead"

// pullReactor answers Pull requests itself once armed: with the answer
// fn gives for the n-th of them.
type pullReactor struct {
	n  atomic.Int64
	fn func(n int64) *pubsubpb.PullResponse
}

func (r *pullReactor) React(any) (bool, any, error) {
	if r.fn == nil {
		return false, nil, nil
	}
	return true, r.fn(r.n.Add(1)), nil
}

func newReader(t *testing.T, react *pullReactor) (*deadletter.Reader, *pstest.Server) {
	t.Helper()
	srv := pstest.NewServer(pstest.ServerReactorOption{FuncName: "Pull", Reactor: react})
	t.Cleanup(func() { _ = srv.Close() })
	ctx := context.Background()
	_, err := srv.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/p1/topics/dead"})
	require.NoError(t, err)
	_, err = srv.GServer.CreateSubscription(ctx, &pubsubpb.Subscription{Name: sub, Topic: "projects/p1/topics/dead", AckDeadlineSeconds: 10})
	require.NoError(t, err)
	r, err := deadletter.New(ctx, deadletter.Config{Project: "p1", PullTimeout: time.Second, Options: []option.ClientOption{
		option.WithEndpoint(srv.Addr), option.WithoutAuthentication(), option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials()))}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r, srv
}

func received(ids ...string) *pubsubpb.PullResponse {
	resp := &pubsubpb.PullResponse{}
	for _, id := range ids {
		resp.ReceivedMessages = append(resp.ReceivedMessages, &pubsubpb.ReceivedMessage{
			AckId: fmt.Sprintf("ack-%s-%d", id, time.Now().UnixNano()), Message: &pubsubpb.PubsubMessage{MessageId: id, Data: []byte(id)}})
	}
	return resp
}

// TestPullCountsEachMessageOnce: a message Pub/Sub hands out again while
// the listing runs (its lease ran out) is counted once, with its newest ack
// id, and the listing ends there, read through, instead of counting it on
// every pull until --max.
func TestPullCountsEachMessageOnce(t *testing.T) {
	t.Parallel()
	var last string
	react := &pullReactor{}
	react.fn = func(n int64) *pubsubpb.PullResponse {
		resp := received("m1", "m2")
		if n > 1 {
			resp = received("m2") // redelivered: its lease ran out
			last = resp.ReceivedMessages[0].AckId
		}
		return resp
	}
	r, _ := newReader(t, react)
	msgs, exhausted, err := r.Pull(context.Background(), sub, 1000)
	require.NoError(t, err)
	require.True(t, exhausted, "read through")
	require.Len(t, msgs, 2)
	require.Equal(t, []string{"m1", "m2"}, []string{msgs[0].MessageID, msgs[1].MessageID})
	require.Equal(t, last, msgs[1].AckID, "the newest lease's ack id")
	require.EqualValues(t, 2, react.n.Load(), "one more pull saw nothing new, and the listing ended")
}

// TestPullEndsAtItsDeadline: a subscription that keeps handing out new
// messages is read until the caller's deadline, not until --max: the
// listing says it did not read through.
func TestPullEndsAtItsDeadline(t *testing.T) {
	t.Parallel()
	react := &pullReactor{}
	react.fn = func(n int64) *pubsubpb.PullResponse {
		time.Sleep(10 * time.Millisecond) // a server answering slowly
		return received(fmt.Sprintf("m%d", n))
	}
	r, _ := newReader(t, react)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	msgs, exhausted, err := r.Pull(ctx, sub, 100_000)
	require.NoError(t, err)
	require.False(t, exhausted, "more may remain")
	require.NotEmpty(t, msgs)
	require.Less(t, len(msgs), 100_000)
}

// TestPullReadsWhatTheSubscriptionHolds: on pstest, messages published to
// the dead-letter topic are read once each, and an empty pull ends the
// listing.
func TestPullReadsWhatTheSubscriptionHolds(t *testing.T) {
	t.Parallel()
	r, srv := newReader(t, &pullReactor{})
	for i := range 3 {
		srv.Publish("projects/p1/topics/dead", []byte(fmt.Sprint(i)), nil)
	}
	msgs, exhausted, err := r.Pull(context.Background(), sub, 1000)
	require.NoError(t, err)
	require.True(t, exhausted)
	require.Len(t, msgs, 3)
	require.NoError(t, r.Nack(context.Background(), sub, []string{msgs[0].AckID, msgs[1].AckID, msgs[2].AckID}))
	again, _, err := r.Pull(context.Background(), sub, 2)
	require.NoError(t, err)
	require.Len(t, again, 2, "handed back, read again, --max respected")
}
