package localwarehouse_test

import (
	"testing"

	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/segmentstream/ontology-replication/shared/store"
	"github.com/segmentstream/ontology-replication/shared/testbench/sdkfixture"
)

func pubsubOpts(srv *pstest.Server) []option.ClientOption {
	return []option.ClientOption{option.WithEndpoint(srv.Addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials()))}
}

func demoTarget(t *testing.T, m sdkfixture.Manifest, sel []sdkfixture.Selection) store.Target {
	t.Helper()
	tg, err := sdkfixture.StaticTarget(m, sel)
	require.NoError(t, err)
	return tg
}
