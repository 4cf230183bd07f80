package warehouse

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/segmentstream/ontology-replication/shared/registry"
)

// View is one latest-state view: its name and its query.
type View struct {
	Name  string
	Query string
}

// manifest is the part of the SDK's stored manifest the views read.
type manifest struct {
	Entities []struct {
		ID         string `json:"id"`
		Name       string `json:"name"`
		Properties []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"properties"`
		Relationships []struct {
			Name        string `json:"name"`
			Cardinality string `json:"cardinality"`
		} `json:"relationships"`
	} `json:"entities"`
}

type field struct{ name, storage string }

// ErrViewCollision: two views would have the same name, ignoring case.
var ErrViewCollision = errors.New("replicated entity and relationship view names collide")

var identifierPattern = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// identifier quotes a BigQuery identifier, as the seed's identifier(): only
// letters, digits, '_' and '-' are accepted.
func identifier(value string) (string, error) {
	if !identifierPattern.MatchString(value) {
		return "", fmt.Errorf("invalid BigQuery replication identifier %q", value)
	}
	return "`" + value + "`", nil
}

// literal quotes a string literal, as the seed's literal().
func literal(value string) string {
	return "'" + strings.ReplaceAll(strings.ReplaceAll(value, `\`, `\\`), "'", `\'`) + "'"
}

// queryFields is the SDK's queryFields: id, the system timestamps, the
// properties, then each one-relationship's <name>_id, with their storage.
func queryFields(props []struct {
	Name string `json:"name"`
	Type string `json:"type"`
}, rels []struct {
	Name        string `json:"name"`
	Cardinality string `json:"cardinality"`
}) []field {
	out := []field{{"id", "string"}, {"created_at", "timestamp"}, {"updated_at", "timestamp"}}
	for _, p := range props {
		out = append(out, field{p.Name, p.Type})
	}
	for _, r := range rels {
		if r.Cardinality == "one" {
			out = append(out, field{r.Name + "_id", "string"})
		}
	}
	return out
}

var bigQueryTypes = map[string]string{
	"integer": "INT64", "number": "FLOAT64", "boolean": "BOOL", "date": "DATE", "timestamp": "TIMESTAMP",
}

// ViewSpec is one latest-state view, independent of SQL dialect: the
// latest row per record_key of one entity and record kind, tombstones
// removed, and its columns.
type ViewSpec struct {
	Name     string
	EntityID string
	Kind     string // "entity" or "edge:<relationship>"
	Columns  []ViewColumn
}

// ViewColumn is one column of a view: a payload field and its storage.
type ViewColumn struct {
	Name    string
	Storage string // string, integer, number, boolean, date, timestamp or json
}

// ViewTarget is what a replication target's views are built from: its
// generation and source, the manifest it was started with and what it
// selected (the warehouse's own copy of the store's target, so that the
// warehouse does not depend on the database's package).
type ViewTarget struct {
	Generation string
	SourceID   string
	// Manifest is the ontology manifest (JSON) the generation was started
	// with.
	Manifest json.RawMessage
	// Selection is what the generation replicates.
	Selection []Selection
}

// Selection is one selected entity of a target: the entity id, its
// replicated fields and its replicated many-relationships.
type Selection struct {
	EntityID      string
	Fields        []string
	Relationships []string
}

// ViewSpecs builds the view model of a target as the SDK's replicationViews
// (replication/bigquery.js, seed 001) does: per selected entity, id and its
// selected fields in query-field order; per selected relationship, its
// edges' source_id and target_id. Field names are validated as identifiers;
// names that collide, ignoring case, are an error.
func ViewSpecs(t ViewTarget) ([]ViewSpec, error) {
	var m manifest
	if err := json.Unmarshal(t.Manifest, &m); err != nil {
		return nil, fmt.Errorf("target %s: manifest: %w", t.Generation, err)
	}
	var specs []ViewSpec
	for _, sel := range t.Selection {
		i := -1
		for j, e := range m.Entities {
			if e.ID == sel.EntityID {
				i = j
			}
		}
		if i < 0 {
			return nil, fmt.Errorf("target %s: selected entity %q is not in its manifest", t.Generation, sel.EntityID)
		}
		entity := m.Entities[i]
		selected := map[string]bool{}
		for _, f := range sel.Fields {
			selected[f] = true
		}
		spec := ViewSpec{Name: entity.Name, EntityID: entity.ID, Kind: "entity"}
		for _, f := range queryFields(entity.Properties, entity.Relationships) {
			if f.name != "id" && !selected[f.name] {
				continue
			}
			if _, err := identifier(f.name); err != nil {
				return nil, err
			}
			spec.Columns = append(spec.Columns, ViewColumn{Name: f.name, Storage: f.storage})
		}
		specs = append(specs, spec)
		for _, rel := range sel.Relationships {
			specs = append(specs, ViewSpec{Name: entity.Name + "_" + rel, EntityID: entity.ID, Kind: "edge:" + rel,
				Columns: []ViewColumn{{Name: "source_id", Storage: "string"}, {Name: "target_id", Storage: "string"}}})
		}
	}
	seen := map[string]bool{}
	for _, v := range specs {
		key := strings.ToLower(v.Name)
		if seen[key] {
			return nil, fmt.Errorf("%w: %q", ErrViewCollision, v.Name)
		}
		seen[key] = true
	}
	return specs, nil
}

// BigQuery renders the view's query in BigQuery SQL, as replicationViews:
// JSON_VALUE (JSON_QUERY for json fields), SAFE_CAST for typed fields, and
// ROW_NUMBER() by revision then event_id, first rank, then tombstones.
func (v ViewSpec) BigQuery(table string, t ViewTarget) string {
	var columns []string
	for _, c := range v.Columns {
		path := literal("$." + c.Name)
		if v.Kind != "entity" {
			columns = append(columns, "JSON_VALUE(payload, "+path+") AS "+c.Name)
			continue
		}
		value := "JSON_VALUE(payload, " + path + ")"
		if c.Storage == "json" {
			value = "JSON_QUERY(payload, " + path + ")"
		}
		if typ, ok := bigQueryTypes[c.Storage]; ok {
			value = "SAFE_CAST(" + value + " AS " + typ + ")"
		}
		columns = append(columns, value+" AS `"+c.Name+"`")
	}
	return `SELECT ` + strings.Join(columns, ", ") + ` FROM (
      SELECT *, ROW_NUMBER() OVER (PARTITION BY record_key ORDER BY revision DESC, event_id DESC) AS position
      FROM ` + table + `
      WHERE generation = ` + literal(t.Generation) + ` AND source_id = ` + literal(t.SourceID) + `
        AND entity_id = ` + literal(v.EntityID) + ` AND record_kind = ` + literal(v.Kind) + `
    ) WHERE position = 1 AND NOT deleted`
}

// Views builds the BigQuery latest-state views of a target (replicationViews
// of seed 001). table is the events table's `project.dataset.table` (the
// seed's is always <project>.ontology_internal.events).
func Views(project, table string, t ViewTarget) ([]View, error) {
	if _, err := identifier(project); err != nil {
		return nil, err
	}
	specs, err := ViewSpecs(t)
	if err != nil {
		return nil, err
	}
	views := make([]View, len(specs))
	for i, s := range specs {
		views[i] = View{Name: s.Name, Query: s.BigQuery(table, t)}
	}
	return views, nil
}

// ViewsDataset is where a workspace's views go: the registry's
// views_dataset (by default the events table's dataset).
func ViewsDataset(bq registry.BigQuery) string { return cmp.Or(bq.ViewsDataset, bq.Dataset) }

// CreateViews creates or replaces the views of the target in the views
// dataset (ViewsDataset), one CREATE OR REPLACE VIEW statement each, through the
// BigQuery client. It returns the fully qualified view names.
func (b *BigQuery) CreateViews(ctx context.Context, ws registry.Workspace, t ViewTarget) ([]string, error) {
	views, err := Views(ws.BigQuery.Project, tableRef(ws.BigQuery), t)
	if err != nil {
		return nil, err
	}
	c, err := b.client(ctx, ws.BigQuery)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, v := range views {
		if _, err := identifier(v.Name); err != nil {
			return names, err
		}
		full := "`" + ws.BigQuery.Project + "." + ViewsDataset(ws.BigQuery) + "." + v.Name + "`"
		q := c.Query("CREATE OR REPLACE VIEW " + full + " AS\n" + v.Query)
		q.Location = ws.BigQuery.Location
		if _, err := q.Read(ctx); err != nil {
			return names, fmt.Errorf("warehouse: create view %s: %w", full, err)
		}
		names = append(names, strings.Trim(full, "`"))
	}
	return names, nil
}
