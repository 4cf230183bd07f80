package localwarehouse

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/segmentstream/ontology-replication/shared/testbench/bqserver"
)

// The warehouse answers the product's BigQuery queries (the verifier's
// lookup, the audit's buckets and records) by running the very SQL the
// BigQuery client sent, rewritten into PostgreSQL by the few mechanical
// rules below, against the local events table. So every test and the
// local mode execute the BigQuery spelling of the lookup and of the
// audit's latest-state rule, not a PostgreSQL copy of it that could drift.
//
// The rules: the table reference (`project.dataset.table`) is the events
// table; `x IN UNNEST(@a)` is `x = ANY(@a)`; `CAST(e AS INT64)` and
// `CAST(e AS STRING)` are bq_int64(e) and bq_string(e) (a STRING of the
// form 0x… casts as hexadecimal, as in BigQuery, an error past INT64's
// range); a subquery in FROM gets
// the alias PostgreSQL 15 requires; `_PARTITIONTIME` is ingested_at and
// `TIMESTAMP_TRUNC(t, DAY)` date_trunc; each named parameter becomes a
// positional one of its BigQuery type. The functions BigQuery has and
// PostgreSQL lacks are sqlDialectFunctions. A query that uses anything
// else fails, so that a new construct is noticed.

// sqlDialectFunctions are BigQuery's functions the product's queries use,
// in PostgreSQL: IF, TO_HEX of MD5 (PostgreSQL's md5 is already the hex
// digest that BigQuery's TO_HEX(MD5(…)) spells), SUBSTR with an INT64
// length, and the casts.
const sqlDialectFunctions = `
CREATE OR REPLACE FUNCTION "if"(boolean, anyelement, anyelement) RETURNS anyelement LANGUAGE sql IMMUTABLE AS
  'SELECT CASE WHEN $1 THEN $2 ELSE $3 END';
CREATE OR REPLACE FUNCTION to_hex(text) RETURNS text LANGUAGE sql IMMUTABLE AS 'SELECT $1';
CREATE OR REPLACE FUNCTION substr(text, integer, bigint) RETURNS text LANGUAGE sql IMMUTABLE AS 'SELECT substr($1, $2, $3::int)';
CREATE OR REPLACE FUNCTION bq_int64(v text) RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF v NOT LIKE '0x%' THEN
    RETURN v::bigint;
  END IF;
  -- As BigQuery: a hexadecimal past INT64's range is an error, not a wrap.
  IF length(v) > 18 OR length(v) = 18 AND position(lower(substr(v, 3, 1)) IN '89abcdef') > 0 THEN
    RAISE EXCEPTION 'Bad int64 value: %', v;
  END IF;
  RETURN ('x' || lpad(substr(v, 3), 16, '0'))::bit(64)::bigint;
END $$;
CREATE OR REPLACE FUNCTION bq_int64(numeric) RETURNS bigint LANGUAGE sql IMMUTABLE AS 'SELECT $1::bigint';
CREATE OR REPLACE FUNCTION bq_string(anyelement) RETURNS text LANGUAGE sql IMMUTABLE AS 'SELECT $1::text';
`

var (
	tableReference = regexp.MustCompile("`[^`]+`")
	inUnnest       = regexp.MustCompile(`IN UNNEST\((@\w+)\)`)
	truncDay       = regexp.MustCompile(`TIMESTAMP_TRUNC\((@\w+), DAY\)`)
	namedParameter = regexp.MustCompile(`@(\w+)`)
)

// translate rewrites a BigQuery query of the product into PostgreSQL over
// the events table, with its parameters' values in order.
func translate(sql string, params map[string]bqserver.Param) (string, []any, error) {
	sql = tableReference.ReplaceAllString(sql, "events")
	sql = inUnnest.ReplaceAllString(sql, "= ANY($1)")
	sql = truncDay.ReplaceAllString(sql, "date_trunc('day', $1)")
	sql = strings.ReplaceAll(sql, "_PARTITIONTIME", "ingested_at")
	sql, err := rewriteCasts(sql)
	if err != nil {
		return "", nil, err
	}
	sql = aliasSubqueries(sql)
	var args []any
	position := map[string]int{}
	var bindErr error
	sql = namedParameter.ReplaceAllStringFunc(sql, func(m string) string {
		name := m[1:]
		p, ok := params[name]
		if !ok {
			bindErr = fmt.Errorf("parameter @%s not given", name)
			return m
		}
		n, seen := position[name]
		if !seen {
			v, err := bind(p)
			if err != nil {
				bindErr = fmt.Errorf("parameter @%s: %w", name, err)
				return m
			}
			args = append(args, v)
			n = len(args)
			position[name] = n
		}
		return fmt.Sprintf("$%d::%s", n, pgType(p))
	})
	return sql, args, bindErr
}

// pgType is the PostgreSQL type of a BigQuery parameter.
func pgType(p bqserver.Param) string {
	switch {
	case p.Type == "ARRAY":
		return "text[]"
	case p.Type == "INT64":
		return "bigint"
	case p.Type == "TIMESTAMP":
		return "timestamptz"
	}
	return "text"
}

// bind reads a parameter's value (of the type pgType gives it).
func bind(p bqserver.Param) (any, error) {
	switch p.Type {
	case "STRING":
		return p.Value, nil
	case "INT64":
		return strconv.ParseInt(p.Value, 10, 64)
	case "TIMESTAMP":
		for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05.999999-07:00", "2006-01-02 15:04:05.999999Z07:00"} {
			if t, err := time.Parse(layout, p.Value); err == nil {
				return t, nil
			}
		}
		return nil, fmt.Errorf("timestamp %q", p.Value)
	case "ARRAY":
		if p.ArrayType != "STRING" {
			return nil, fmt.Errorf("ARRAY<%s> is not supported", p.ArrayType)
		}
		return append([]string{}, p.Values...), nil
	}
	return nil, fmt.Errorf("type %s is not supported", p.Type)
}

// closing returns the index of the parenthesis closing the one at open.
func closing(s string, open int) int {
	depth := 0
	for i := open; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

// rewriteCasts rewrites CAST(e AS INT64|STRING) into bq_int64(e) or
// bq_string(e), innermost first.
func rewriteCasts(s string) (string, error) {
	for {
		i := strings.LastIndex(s, "CAST(")
		if i < 0 {
			return s, nil
		}
		open := i + len("CAST")
		end := closing(s, open)
		if end < 0 {
			return "", fmt.Errorf("unbalanced CAST at %d", i)
		}
		inner := s[open+1 : end]
		as := strings.LastIndex(inner, " AS ")
		if as < 0 {
			return "", fmt.Errorf("CAST without AS: %s", inner)
		}
		var fn string
		switch strings.TrimSpace(inner[as+4:]) {
		case "INT64":
			fn = "bq_int64"
		case "STRING":
			fn = "bq_string"
		default:
			return "", fmt.Errorf("CAST to %s is not supported", inner[as+4:])
		}
		s = s[:i] + fn + "(" + inner[:as] + ")" + s[end+1:]
	}
}

// aliasSubqueries names each subquery in FROM, as PostgreSQL 15 requires.
func aliasSubqueries(s string) string {
	for n, from := 0, 0; ; n++ {
		i := strings.Index(s[from:], "FROM (")
		if i < 0 {
			return s
		}
		open := from + i + len("FROM ")
		end := closing(s, open)
		if end < 0 {
			return s
		}
		s = s[:end+1] + fmt.Sprintf(" AS sub%d", n) + s[end+1:]
		from = open + 1
	}
}

// runBigQuery answers a query the product sent to BigQuery: translated,
// run on the events table, every cell as BigQuery's REST API gives it (a
// string, or NULL).
func (l *Local) runBigQuery(ctx context.Context, q bqserver.Query) (bqserver.Result, error) {
	sql, args, err := translate(q.SQL, q.Params)
	if err != nil {
		return bqserver.Result{}, fmt.Errorf("localwarehouse: %w in %s", err, q.SQL)
	}
	rows, err := l.pool.Query(ctx, sql, append([]any{pgx.QueryResultFormats{pgx.TextFormatCode}}, args...)...)
	if err != nil {
		return bqserver.Result{}, queryError(err, sql)
	}
	defer rows.Close()
	var res bqserver.Result
	for _, f := range rows.FieldDescriptions() {
		res.Columns = append(res.Columns, f.Name)
	}
	for rows.Next() {
		raw := rows.RawValues()
		cells := make([]*string, len(raw))
		for i, v := range raw {
			if v != nil {
				s := string(v)
				cells[i] = &s
			}
		}
		res.Rows = append(res.Rows, cells)
	}
	if err := rows.Err(); err != nil {
		return bqserver.Result{}, queryError(err, sql)
	}
	return res, nil
}

// queryError answers a query the database refused as BigQuery answers an
// invalid query or a failed cast: 400 invalidQuery, which no client
// retries; anything else (a lost connection) stays a server error.
func queryError(err error, sql string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return &bqserver.Error{Status: 400, Reason: "invalidQuery", Message: pgErr.Message}
	}
	return fmt.Errorf("localwarehouse: %w in %s", err, sql)
}
