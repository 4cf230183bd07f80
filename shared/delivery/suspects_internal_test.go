package delivery

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/segmentstream/ontology-replication/shared/store"
)

// TestSuspectsRules: the rules that tell an event's own failure from
// Pub/Sub's, each on its own: a failed request suspects its largest event
// (not its first), a lone failure is worth the probe only when it cannot be
// an outage, an event is set aside only once Pub/Sub took other requests to
// its topic between its failures, and a failure of another topic proves
// nothing about this one.
func TestSuspectsRules(t *testing.T) {
	t.Parallel()
	t.Run("the largest is suspected", func(t *testing.T) {
		var ss suspects
		ss.mark("g", []store.Pending{{HistoryID: "small", JSON: []byte("{}")}, {HistoryID: "large", JSON: []byte(strings.Repeat("x", 100))},
			{HistoryID: "smaller", JSON: []byte("{")}})
		require.True(t, ss.isSuspect("g", "large"))
		require.False(t, ss.isSuspect("g", "small"), "not the first one")
	})
	t.Run("an outage is not worth a probe", func(t *testing.T) {
		var ss suspects
		f1 := ss.noteFailure("t")
		require.True(t, ss.worthProbing("t", f1, false), "the topic's first failure")
		f2 := ss.noteFailure("t")
		require.False(t, ss.worthProbing("t", f2, false), "another failure with nothing taken between: an outage")
		ss.published("t")
		f3 := ss.noteFailure("t")
		require.True(t, ss.worthProbing("t", f3, false), "Pub/Sub took a request since the failure before")
		ss.published("other")
		f4 := ss.noteFailure("t")
		require.False(t, ss.worthProbing("t", f4, false), "another topic's publishes prove nothing about this one")
	})
	t.Run("set aside only while Pub/Sub takes others", func(t *testing.T) {
		var ss suspects
		for range suspectFailures {
			setAside, _ := ss.failedAlone("t", "g", "h", codes.ResourceExhausted, ss.noteFailure("t"))
			require.False(t, setAside, "nothing was taken meanwhile: it may be an outage")
		}
		var set bool
		for range suspectFailures {
			ss.published("t")
			set, _ = ss.failedAlone("t", "g", "h2", codes.ResourceExhausted, ss.noteFailure("t"))
		}
		require.True(t, set, "three failures of it alone while other requests were taken")
	})
	t.Run("never the event's", func(t *testing.T) {
		for _, c := range []codes.Code{codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted} {
			require.True(t, neverTheEvents(c), "%v", c)
		}
		for _, c := range []codes.Code{codes.ResourceExhausted, codes.Internal, codes.Unknown} {
			require.False(t, neverTheEvents(c), "%v", c)
		}
	})
}
