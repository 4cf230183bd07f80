package delivery

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/segmentstream/ontology-replication/shared/publish"
	"github.com/segmentstream/ontology-replication/shared/store"
)

// refuser is a pstest reactor refusing every request that holds a message
// marked BAD, counting requests.
type refuser struct{ requests atomic.Int64 }

func (r *refuser) React(req any) (bool, any, error) {
	r.requests.Add(1)
	for _, m := range req.(*pubsubpb.PublishRequest).Messages {
		if strings.HasPrefix(string(m.Data), "BAD") {
			return true, nil, status.Error(codes.InvalidArgument, "refused")
		}
	}
	return false, nil, nil
}

// TestBisection: for refused events anywhere in a batch, every other event
// is accepted, in exactly one request that Pub/Sub took, every refused one
// is found, and the requests stay within the bound: 2 + ⌈log₂ n⌉ for one
// refused event, 2n + ⌈log₂ n⌉ + 2 however many.
func TestBisection(t *testing.T) {
	t.Parallel()
	r := &refuser{}
	srv := pstest.NewServer(pstest.ServerReactorOption{FuncName: "Publish", Reactor: r})
	t.Cleanup(func() { _ = srv.Close() })
	ctx := context.Background()
	const topic = "projects/p/topics/t"
	_, err := srv.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: topic})
	require.NoError(t, err)
	pub, err := publish.New(ctx, publish.Config{EmulatorHost: srv.Addr})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	svc := &Service{cfg: Config{Publisher: pub}}

	run := func(t *testing.T, n int, bad []int) (requests int64) {
		t.Helper()
		events := make([]store.Pending, n)
		for i := range events {
			data := fmt.Sprintf("event %d", i)
			if slices.Contains(bad, i) {
				data = "BAD " + data
			}
			events[i] = store.Pending{HistoryID: fmt.Sprint(i), JSON: []byte(data)}
		}
		srv.ClearMessages()
		before := r.requests.Load()
		p := &publishing{svc: svc, topic: topic}
		require.NoError(t, p.publish(ctx, events))
		var refused []int
		for _, a := range p.rejected {
			var i int
			fmt.Sscan(a.HistoryID, &i)
			refused = append(refused, i)
		}
		slices.Sort(refused)
		want := slices.Clone(bad)
		slices.Sort(want)
		require.Equal(t, want, slices.Compact(refused), "every refused event found, once")
		require.Len(t, p.rejected, len(bad))
		stored := map[string]int{}
		for _, m := range srv.Messages() {
			stored[string(m.Data)]++
		}
		require.Len(t, stored, n-len(bad), "every other event stored")
		for data, k := range stored {
			require.Equal(t, 1, k, "%s stored once", data)
		}
		require.Len(t, p.accepted, n-len(bad))
		return r.requests.Load() - before
	}
	t.Run("one refused, anywhere", func(t *testing.T) {
		for _, n := range []int{1, 2, 3, 7, 100} {
			for pos := range n {
				got := run(t, n, []int{pos})
				bound := int64(2)
				for k := 1; k < n; k *= 2 {
					bound++
				}
				require.LessOrEqual(t, got, bound, "n=%d, refused at %d", n, pos)
			}
		}
	})
	t.Run("many refused", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		for _, k := range []int{2, 5, 30, 99, 100} {
			bad := rng.Perm(100)[:k]
			got := run(t, 100, bad)
			require.LessOrEqual(t, got, int64(2*100+7+2), "%d refused: at most 2n + ⌈log₂ n⌉ + 2", k)
		}
	})
	t.Run("none refused", func(t *testing.T) {
		require.EqualValues(t, 1, run(t, 100, nil))
	})
}
