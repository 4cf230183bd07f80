package sdkfixture

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The components' database roles, as an operator makes them: terraform's
// README (its Database access section) has the GRANT statements of each
// component, written for an example project and the example history
// tables. ComponentRoles runs them, for one database, as login roles with
// passwords, so that the tests and the chaos run connect as the
// components do, not as the superuser.

// Components are the components that connect to a workspace's database.
var Components = []string{"drain", "verify", "job"}

// README's example names, replaced by ComponentRoles: the IAM users'
// project, and the example history tables.
const (
	readmeProject = "acme-replication.iam"
	readmeHistory = "customer_history, product_history, order_history"
)

// protocol4Only are the tables the SDK's v4 migration creates; the
// README says to leave them out of the GRANTs on a database still at
// protocol 3, with the grant on the column it adds to the target table.
var protocol4Only = []string{"_ontology_replication_delivery", "_ontology_replication_revision"}

// Grants returns the SQL of the Database access section of terraform's
// README (readme, its text).
func Grants(readme []byte) (string, error) {
	section := regexp.MustCompile("(?s)## Database access\n.*?```sql\n(.*?)```").FindSubmatch(readme)
	if section == nil {
		return "", errors.New("sdkfixture: terraform/README.md has no Database access section with a sql block")
	}
	grants := string(section[1])
	if !strings.Contains(grants, readmeHistory) || !strings.Contains(grants, readmeProject) {
		return "", fmt.Errorf("sdkfixture: the README's GRANTs no longer name the example tables (%s) or project (%s)", readmeHistory, readmeProject)
	}
	return grants, nil
}

// GrantAtProtocol3 is a GRANT as the README says to run it at protocol 3:
// without the protocol-4 tables, and not at all when it names no other or
// names the protocol-4 column verified_count.
func GrantAtProtocol3(statement string) string {
	if strings.Contains(statement, "verified_count") {
		return "" // the targets' columns the migration adds
	}
	on := regexp.MustCompile(`(?s)( ON )(.*?)(\s+TO )`)
	m := on.FindStringSubmatchIndex(statement)
	if m == nil {
		return statement
	}
	var kept []string
	for _, table := range strings.Split(statement[m[4]:m[5]], ",") {
		if table = strings.TrimSpace(table); !slices.Contains(protocol4Only, table) {
			kept = append(kept, table)
		}
	}
	if len(kept) == 0 {
		return ""
	}
	return statement[:m[4]] + strings.Join(kept, ", ") + statement[m[5]:]
}

// ComponentRoles creates, in the database at ownerURL (owner is a session
// of it as its owner or a superuser), a login role per component named as
// the README names them for that database (roles are the cluster's),
// holding exactly grants (Grants' SQL) with the example history tables
// replaced by the database's capture tables, and returns each component's
// URL and a function that drops the roles.
func ComponentRoles(ctx context.Context, owner Querier, ownerURL, grants string, protocol int) (map[string]string, func(context.Context), error) {
	u, err := url.Parse(ownerURL)
	if err != nil {
		return nil, nil, fmt.Errorf("sdkfixture: the owner's URL: %w", err)
	}
	database := strings.TrimPrefix(u.Path, "/")
	urls := map[string]string{}
	var script strings.Builder
	roles := make([]string, 0, len(Components))
	for _, c := range Components {
		role := "replication-" + c + "@" + database
		roles = append(roles, pgx.Identifier{role}.Sanitize())
		password := rand.Text()
		fmt.Fprintf(&script, "CREATE ROLE %s LOGIN PASSWORD '%s';\n", pgx.Identifier{role}.Sanitize(), password)
		cu := *u
		cu.User = url.UserPassword(role, password)
		urls[c] = cu.String()
	}
	drop := func(ctx context.Context) {
		for _, role := range roles {
			_, _ = owner.Exec(ctx, "DROP OWNED BY "+role)
			_, _ = owner.Exec(ctx, "DROP ROLE "+role)
		}
	}
	rows, err := owner.Query(ctx, `SELECT quote_ident(c.relname) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
		WHERE t.tgname = '_ontology_capture' ORDER BY 1`)
	if err != nil {
		return nil, nil, fmt.Errorf("sdkfixture: the capture tables: %w", err)
	}
	history, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(history) == 0 {
		return nil, nil, fmt.Errorf("sdkfixture: the capture tables: none found (%v)", err)
	}
	grants = strings.ReplaceAll(grants, readmeHistory, strings.Join(history, ", "))
	grants = strings.ReplaceAll(grants, readmeProject, database)
	for _, statement := range strings.Split(grants, ";") {
		if protocol == 3 {
			statement = GrantAtProtocol3(statement)
		}
		script.WriteString(statement + ";")
	}
	if _, err := owner.Exec(ctx, script.String()); err != nil {
		drop(ctx)
		return nil, nil, fmt.Errorf("sdkfixture: the README's GRANTs, run as the database owner: %w", err)
	}
	return urls, drop, nil
}
