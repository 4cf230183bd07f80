package sandbox

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/segmentstream/ontology-replication/shared/testbench/pgbouncer"
)

// startPooler starts a PgBouncer in session mode in front of the ontology
// database (--pooled), accepting each component's role, as a fleet's
// deployment puts a pooler (Cloud SQL's Managed Connection Pooling) in
// front of the instance; the registry's entries are then pooled.
func (l *Local) startPooler(ctx context.Context) error {
	users := map[string]string{}
	var server string
	for _, raw := range l.Urls.roles {
		u, err := url.Parse(raw)
		if err != nil {
			return fmt.Errorf("a role's URL: %w", err)
		}
		password, _ := u.User.Password()
		users[u.User.Username()] = password
		server = u.Host
	}
	p, err := pgbouncer.Start(ctx, pgbouncer.Config{Server: server, Users: users,
		Settings: map[string]string{"default_pool_size": "4", "server_idle_timeout": "60"}})
	if err != nil {
		return err
	}
	l.pooler = p
	l.cleanup = append(l.cleanup, func() { _ = p.Stop() })
	return nil
}

// pooledURL is dbURL (a role's URL, with its query) through the pooler.
func (l *Local) pooledURL(dbURL string) string {
	u, _ := url.Parse(dbURL)
	password, _ := u.User.Password()
	pooled, _ := url.Parse(l.pooler.URL(u.User.Username(), password, strings.TrimPrefix(u.Path, "/")))
	q := pooled.Query()
	for k, v := range u.Query() {
		if k != "sslmode" {
			q[k] = v
		}
	}
	pooled.RawQuery = q.Encode()
	return pooled.String()
}
