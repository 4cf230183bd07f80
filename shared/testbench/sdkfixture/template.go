package sdkfixture

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/segmentstream/ontology-replication/shared/testbench/pgtest"
)

// V4Template is the Demo ontology at protocol 4 with replication paused and
// no generation.
var V4Template = pgtest.Template{Name: "sdk_v4", Build: func(ctx context.Context, url string) error {
	return withConn(ctx, url, func(conn *pgx.Conn) error { return Install(ctx, conn, Demo, 4) })
}}

// V3Template is the Demo ontology at protocol 3 (SDK 0.12) with replication
// paused and no generation.
var V3Template = pgtest.Template{Name: "sdk_v3", Build: func(ctx context.Context, url string) error {
	return withConn(ctx, url, func(conn *pgx.Conn) error { return Install(ctx, conn, Demo, 3) })
}}

func withConn(ctx context.Context, url string, fn func(*pgx.Conn) error) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return fn(conn)
}
