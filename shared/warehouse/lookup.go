package warehouse

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/bigquery"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"

	"github.com/segmentstream/ontology-replication/shared/registry"
)

// Config configures a BigQuery warehouse.
type Config struct {
	// LookupTimeout bounds one lookup, including the client's own retries
	// of 5xx answers. Default: 20s.
	LookupTimeout time.Duration
	// AuditTimeout bounds one audit query (which reads a generation's rows
	// of seven columns). Default: 10m.
	AuditTimeout time.Duration
	// ClientOptions are extra client options for every workspace (tests).
	ClientOptions []option.ClientOption
}

// BigQuery looks events up in the workspaces' BigQuery tables and manages
// their views, with one client per project and endpoint.
type BigQuery struct {
	cfg Config

	mu      sync.Mutex
	clients map[string]*bigquery.Client
}

// NewBigQuery returns a BigQuery warehouse. Clients are created on first use.
func NewBigQuery(cfg Config) (*BigQuery, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("warehouse: invalid config: %w", err)
	}
	cfg.LookupTimeout = cmp.Or(cfg.LookupTimeout, 20*time.Second)
	cfg.AuditTimeout = cmp.Or(cfg.AuditTimeout, 10*time.Minute)
	return &BigQuery{cfg: cfg, clients: map[string]*bigquery.Client{}}, nil
}

// Validate reports the first invalid field (a zero field takes its
// default).
func (c Config) Validate() error {
	if c.LookupTimeout != 0 && (c.LookupTimeout < time.Second || c.LookupTimeout > 10*time.Minute) {
		return fmt.Errorf("LookupTimeout %v: must be between 1s and 10m", c.LookupTimeout)
	}
	if c.AuditTimeout != 0 && (c.AuditTimeout < time.Second || c.AuditTimeout > time.Hour) {
		return fmt.Errorf("AuditTimeout %v: must be between 1s and 1h", c.AuditTimeout)
	}
	return nil
}

func (b *BigQuery) client(ctx context.Context, bq registry.BigQuery) (*bigquery.Client, error) {
	key := bq.Project + "|" + bq.Endpoint
	b.mu.Lock()
	defer b.mu.Unlock()
	if c, ok := b.clients[key]; ok {
		return c, nil
	}
	opts := append([]option.ClientOption{}, b.cfg.ClientOptions...)
	if bq.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(bq.Endpoint), option.WithoutAuthentication())
	}
	c, err := bigquery.NewClient(ctx, bq.Project, opts...)
	if err != nil {
		return nil, fmt.Errorf("warehouse: BigQuery client for %s: %w", bq.Project, err)
	}
	if bq.Location != "" {
		c.Location = bq.Location
	}
	b.clients[key] = c
	return c, nil
}

// Close closes the clients.
func (b *BigQuery) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	for k, c := range b.clients {
		errs = append(errs, c.Close())
		delete(b.clients, k)
	}
	return errors.Join(errs...)
}

// tableRef is the table's standard-SQL reference. The registry restricts
// project, dataset and table to characters that need no escaping inside
// backticks.
func tableRef(bq registry.BigQuery) string {
	return "`" + bq.Project + "." + bq.Dataset + "." + bq.Table + "`"
}

// The lookup reads only the event_id column and filters on generation (the
// table's first clustering column) and the ids (its second), so BigQuery
// reads only the blocks that can hold them. Several workspaces' events in
// one table are looked up together: event ids are hashes of the source,
// the history row and the generation, unique across generations, so the
// two filters select exactly the asked events. On the ingestion-time
// partitioned table terraform creates, it also prunes partitions older than
// the day before the oldest acceptance (an event lands after it is
// published, and is published before it is accepted); rows not yet in a
// partition (_PARTITIONTIME NULL) are included.
const (
	sqlLookup = `SELECT event_id FROM %s
WHERE generation IN UNNEST(@generations) AND event_id IN UNNEST(@ids)`
	sqlLookupPartitioned = sqlLookup + `
  AND (_PARTITIONTIME IS NULL OR _PARTITIONTIME >= TIMESTAMP_TRUNC(@since, DAY))`
)

// Lookup is one generation's events to look for: their ids and the oldest
// time any of them was accepted (zero when unknown, which disables
// partition pruning).
type Lookup struct {
	Generation    string
	EventIDs      []string
	AcceptedSince time.Time
}

// MaxLookupIDs bounds the ids of one query (BigQuery takes up to 1 MB of
// query parameters; 10,000 ids of 64 hex digits is two thirds of it).
const MaxLookupIDs = 10_000

// Present returns which of the lookups' event ids the events table holds:
// one parameterised query for all of them (at most MaxLookupIDs ids), never
// ids pasted into SQL.
func (b *BigQuery) Present(ctx context.Context, table registry.BigQuery, lookups []Lookup) ([]string, error) {
	var ids, generations []string
	var since time.Time
	for _, l := range lookups {
		if len(l.EventIDs) == 0 {
			continue
		}
		ids = append(ids, l.EventIDs...)
		generations = append(generations, l.Generation)
		if since.IsZero() || l.AcceptedSince.IsZero() || l.AcceptedSince.Before(since) {
			since = l.AcceptedSince
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	if len(ids) > MaxLookupIDs {
		return nil, fmt.Errorf("warehouse: lookup in %s: %d ids, more than one query takes (%d)", tableRef(table), len(ids), MaxLookupIDs)
	}
	params := []bigquery.QueryParameter{{Name: "generations", Value: generations}, {Name: "ids", Value: ids}}
	sql := fmt.Sprintf(sqlLookup, tableRef(table))
	if table.Partitioning == registry.PartitioningIngestionTime && !since.IsZero() {
		sql = fmt.Sprintf(sqlLookupPartitioned, tableRef(table))
		params = append(params, bigquery.QueryParameter{Name: "since", Value: since.Add(-24 * time.Hour).UTC()})
	}
	present := make([]string, 0, len(ids))
	err := b.readRows(ctx, table, "lookup", b.cfg.LookupTimeout, sql, params, func(row []bigquery.Value) error {
		if len(row) == 1 {
			if id, ok := row[0].(string); ok {
				present = append(present, id)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return present, nil
}

// readRows runs one parameterised query (what names it in errors) within
// timeout, including the client's own retries, and hands each answer row
// to fn. Every error is wrapped with the query and the table; one of the
// timeout says so.
func (b *BigQuery) readRows(ctx context.Context, table registry.BigQuery, what string, timeout time.Duration, sql string,
	params []bigquery.QueryParameter, fn func(row []bigquery.Value) error) error {
	c, err := b.client(ctx, table)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("BigQuery %s in %s: no answer within %v", what, tableRef(table), timeout))
	defer cancel()
	q := c.Query(sql)
	q.Parameters = params
	q.Location = table.Location // not taken from the client on the fast path
	it, err := q.Read(ctx)
	if err != nil {
		return queryError(ctx, table, what, err)
	}
	for {
		var row []bigquery.Value
		err := it.Next(&row)
		if err == iterator.Done {
			return nil
		}
		if err != nil {
			return queryError(ctx, table, what, err)
		}
		if err := fn(row); err != nil {
			return fmt.Errorf("warehouse: %s in %s: %w", what, tableRef(table), err)
		}
	}
}

func queryError(ctx context.Context, table registry.BigQuery, what string, err error) error {
	if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
		return fmt.Errorf("warehouse: %w (%w)", cause, err)
	}
	return fmt.Errorf("warehouse: %s in %s: %w", what, tableRef(table), err)
}

// TableKey identifies an events table (and how it is reached): workspaces
// with the same key share one table, and their lookups one query.
func TableKey(table registry.BigQuery) string {
	return strings.Join([]string{table.Endpoint, table.Project, table.Dataset, table.Table, table.Location, table.Partitioning}, "\x00")
}
