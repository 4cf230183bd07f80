package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

// TestATouchedSessionOutlivesTheIdleTimeout: a session whose batch is out
// three times as long as the store's IdleTimeout, touched when due (as its
// drainer does), keeps its claim, and acknowledges it.
func TestATouchedSessionOutlivesTheIdleTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	e.products(t, 3)
	tracer := &statementCounter{}
	st := tracedStore(t, e, tracer, store.Config{IdleTimeout: time.Second})
	ss := session(t, st)
	c := claimOn(t, e, ss)
	require.Len(t, c.Events, 3)
	require.False(t, ss.TouchAt().IsZero(), "a session with a batch out is due touches")
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		time.Sleep(time.Until(ss.TouchAt())) // the drainer's own timer
		require.NoError(t, ss.Touch(e.ctx))
	}
	require.GreaterOrEqual(t, tracer.touches.Load(), int64(6), "touched every IdleTimeout/3")
	n, _, _, err := ss.Next(e.ctx, []store.Finishing{{Claim: c, Accepted: c.IDs()}}, false)
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	require.True(t, ss.TouchAt().IsZero(), "nothing out: no touch due")
}

// TestALiveClaimOutlivesTheIdleTimeout: a claim whose batch is out three
// times as long as the store's IdleTimeout keeps its session (its process
// touches it meanwhile) and acknowledges its events.
func TestALiveClaimOutlivesTheIdleTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &sdkfixture.V4Template)
	e.start(t)
	e.products(t, 3)
	st, err := store.New(e.pool, store.Config{IdleTimeout: time.Second})
	require.NoError(t, err)
	_, _, c, err := st.ClaimActive(e.ctx)
	require.NoError(t, err)
	require.Len(t, c.Events, 3)
	holders := e.claimHolders(t)
	require.Len(t, holders, 1)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		require.Equal(t, holders, e.claimHolders(t), "the claim's session is alive")
		time.Sleep(100 * time.Millisecond) // its publish is out: the test's own pace
	}
	n, err := c.Finish(e.ctx, c.IDs(), nil)
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
}
