package delivery

import (
	"context"
	"log/slog"
	"time"
)

// LogConnections is the line a process writes, every ConnectionsInterval,
// for each PostgreSQL server it opened connections to in that time: the
// churn the server pays, a session (a process, a login, cold caches) for
// each. terraform's replication/connections_opened reads it; on a fleet
// without a pooler it is about one a commit (README, Connections to the
// SDK's database).
const LogConnections = "replication connections"

// ConnectionsInterval is how often ReportConnections writes its lines.
const ConnectionsInterval = time.Minute

// ReportConnections writes LogConnections every interval, for each server
// the process opened connections to since the last line, until ctx ends.
func (s *Service) ReportConnections(ctx context.Context, interval time.Duration) {
	last := map[string]int64{}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, st := range s.cfg.Pools.Stats() {
			if opened := st.Opened - last[st.Server]; opened > 0 {
				LogConnectionsOpened(ctx, s.log, st.Server, opened, st.Open, interval)
			}
			last[st.Server] = st.Opened
		}
	}
}

// LogConnectionsOpened writes one LogConnections line: opened connections
// to server over interval, open of them open now.
func LogConnectionsOpened(ctx context.Context, log *slog.Logger, server string, opened int64, open int, interval time.Duration) {
	log.InfoContext(ctx, LogConnections, slog.String("server", server), slog.Int64("opened", opened), slog.Int("open", open),
		slog.Int64("interval_s", int64(interval.Seconds())))
}
