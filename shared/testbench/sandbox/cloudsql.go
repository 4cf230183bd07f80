package sandbox

import (
	"fmt"
	"net/url"
	"strings"

	"cloud.google.com/go/cloudsqlconn"

	"github.com/segmentstream/ontology-replication/shared/testbench/cloudsqlproxy"
)

// localInstance is the --cloud-sql stand-in's instance connection name.
const localInstance = localProject + ":local:ontology"

// startCloudSQL starts the Cloud SQL stand-in (--cloud-sql) in front of
// the cluster: its Admin API and server proxy on loopback, each
// component's IAM login token opening its role (the role is the
// component's IAM database user, with the README's GRANTs).
func (l *Local) startCloudSQL() error {
	users := map[string]string{}
	for component, roleURL := range l.Urls.roles {
		u, err := url.Parse(roleURL)
		if err != nil {
			return err
		}
		users[loginToken(component)] = u.User.Username()
	}
	inst, err := cloudsqlproxy.Start(cloudsqlproxy.Config{ConnName: localInstance, SocketDir: l.Cluster.SocketDir(), Port: l.Cluster.Port(), Users: users})
	if err != nil {
		return err
	}
	l.cloudSQL = inst
	l.cleanup = append(l.cleanup, inst.Close)
	return nil
}

// loginToken is a component's IAM login token at the stand-in.
func loginToken(component string) string { return "local-login-" + component }

// cloudSQLDatabase is a component's registry database entry on the
// stand-in: its role as the IAM database user, over the private IP.
func (l *Local) cloudSQLDatabase(component string) string {
	u, _ := url.Parse(l.Urls.roles[component])
	return fmt.Sprintf(`{"instance": %q, "name": %q, "user": %q, "iam_auth": true, "private_ip": true}`,
		localInstance, strings.TrimPrefix(u.Path, "/"), u.User.Username())
}

// dialerOptions are the connector's options that reach the stand-in as
// component (nil without --cloud-sql).
func (l *Local) dialerOptions(component string) []cloudsqlconn.Option {
	if l.cloudSQL == nil {
		return nil
	}
	return l.cloudSQL.DialerOptions(loginToken(strings.TrimPrefix(component, "replication-")))
}

// CloudSQLProblem is what the run's report must fail on with --cloud-sql:
// a component that never logged in through the stand-in.
func (l *Local) CloudSQLProblem() string {
	if l.cloudSQL == nil {
		return ""
	}
	logins := l.cloudSQL.Logins()
	var missing []string
	for _, component := range []string{"drain", "verify", "job"} {
		u, _ := url.Parse(l.Urls.roles[component])
		if logins[u.User.Username()] == 0 {
			missing = append(missing, component)
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("with --cloud-sql, %s never logged in through the Cloud SQL connector", strings.Join(missing, ", "))
}

// DatabasePath says how the components reached the database, for the
// summary.
func (l *Local) DatabasePath() string {
	if l.pooler != nil {
		return "PostgreSQL on loopback through a PgBouncer in session mode (registry database.pooled), each component as its own role"
	}
	if l.cloudSQL == nil {
		return "PostgreSQL on loopback, each component as its own role (--cloud-sql: through the Cloud SQL connector; --pooled: a PgBouncer)"
	}
	logins := 0
	for _, n := range l.cloudSQL.Logins() {
		logins += n
	}
	return fmt.Sprintf("Cloud SQL: the drain, the verifier and the job each through the Cloud SQL Go connector to the stand-in %s, IAM login as its own user, over the private IP; %s, %s",
		localInstance, Plural(int(l.cloudSQL.Certificates()), "ephemeral certificate"), Plural(logins, "login"))
}

// Plural is n things, in English.
func Plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	if strings.HasSuffix(thing, "ch") || strings.HasSuffix(thing, "s") {
		return fmt.Sprintf("%d %ses", n, thing)
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
