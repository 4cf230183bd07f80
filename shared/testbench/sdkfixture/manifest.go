package sdkfixture

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/segmentstream/ontology-replication/shared/store"
)

// Manifest is the part of the SDK's OntologyManifest the replication schema
// reads: entities with their properties and relationships, and the hash.
type Manifest struct {
	Version  int      `json:"version"`
	Hash     string   `json:"hash"`
	Entities []Entity `json:"entities"`
}

// Entity is one entity of a manifest.
type Entity struct {
	ID            string         `json:"id"`
	Name          string         `json:"name"`
	BuiltIn       bool           `json:"builtIn,omitempty"`
	Properties    []Property     `json:"properties"`
	Relationships []Relationship `json:"relationships"`
}

// Property is a stored property; Type is its storage: string, integer,
// number, boolean, date, timestamp or json.
type Property struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

// Relationship is a relationship to another entity: Cardinality "one" is a
// <name>_id column on the entity's table, "many" a join table.
type Relationship struct {
	Name        string `json:"name"`
	To          string `json:"to"`
	Cardinality string `json:"cardinality"`
}

// Field is one field of an entity's query shape (the SDK's queryFields):
// the system columns, the properties and the one-relationship ids.
type Field struct {
	Name    string
	Column  string
	Storage string
}

// Fields returns the entity's query fields in the SDK's order.
func (e Entity) Fields() []Field {
	fields := []Field{
		{"id", "id", "string"},
		{"created_at", "created_at", "timestamp"},
		{"updated_at", "updated_at", "timestamp"},
	}
	for _, p := range e.Properties {
		fields = append(fields, Field{p.Name, p.Name, p.Type})
	}
	for _, r := range e.Relationships {
		if r.Cardinality == "one" {
			fields = append(fields, Field{r.Name + "_id", r.Name + "_id", "string"})
		}
	}
	return fields
}

// Entity returns the entity with the given name.
func (m Manifest) Entity(name string) (Entity, bool) {
	for _, e := range m.Entities {
		if e.Name == name {
			return e, true
		}
	}
	return Entity{}, false
}

// Replicated reports whether the SDK installs capture for the entity.
func (e Entity) Replicated() bool { return !e.BuiltIn && e.Name != "user" }

// Table names, as this fixture's SDK storage names them. The delivery code
// never derives them: it finds history tables through capture triggers.
func tableName(entity string) string    { return entity }
func historyTable(entity string) string { return entity + "_history" }
func joinTable(entity, relationship string) string {
	return entity + "_" + relationship
}

// joinColumns returns the join table's source and target columns.
func joinColumns(entity string, r Relationship) (source, target string) {
	return entity + "_id", r.To + "_id"
}

// withHash returns the manifest with its hash set from its content.
func (m Manifest) withHash() Manifest {
	m.Hash = ""
	raw, _ := json.Marshal(m)
	sum := sha256.Sum256(raw)
	m.Hash = hex.EncodeToString(sum[:])
	return m
}

// Demo is the demo ontology: customers, products and orders, with every
// property storage type, a one-relationship (order.customer) and a
// many-relationship (order.products), plus the SDK's built-in user entity,
// which is never replicated.
var Demo = Manifest{Version: 1, Entities: []Entity{
	{ID: "ent_customer", Name: "customer", Properties: []Property{
		{"name", "string"}, {"email", "string"}, {"age", "integer"}, {"score", "number"},
		{"active", "boolean"}, {"birthday", "date"}, {"signed_up_at", "timestamp"}, {"attributes", "json"},
	}},
	{ID: "ent_product", Name: "product", Properties: []Property{
		{"title", "string"}, {"price", "number"}, {"stock", "integer"},
	}},
	{ID: "ent_order", Name: "order", Properties: []Property{
		{"reference", "string"}, {"total", "number"}, {"quantity", "integer"}, {"paid", "boolean"},
		{"placed_at", "timestamp"}, {"details", "json"},
	}, Relationships: []Relationship{
		{"customer", "customer", "one"},
		{"products", "product", "many"},
	}},
	{ID: "ent_user", Name: "user", BuiltIn: true, Properties: []Property{{"email", "string"}}},
}}.withHash()

// Selection is one entry of a generation's resolved selection (the SDK's
// ReplicationSelection).
type Selection struct {
	EntityID      string   `json:"entityId"`
	Fields        []string `json:"fields"`
	Relationships []string `json:"relationships,omitempty"`
}

// FullSelection resolves the selection with no exclusions, as the SDK's
// resolveReplicationSelection does: every stored business entity, all its
// fields, and its many-relationships to other selected entities.
func (m Manifest) FullSelection() []Selection {
	var out []Selection
	for _, e := range m.Entities {
		if !e.Replicated() {
			continue
		}
		s := Selection{EntityID: e.ID}
		for _, f := range e.Fields() {
			s.Fields = append(s.Fields, f.Name)
		}
		for _, r := range e.Relationships {
			if target, ok := m.Entity(r.To); r.Cardinality == "many" && ok && target.Replicated() {
				s.Relationships = append(s.Relationships, r.Name)
			}
		}
		out = append(out, s)
	}
	return out
}

func (m Manifest) entityByID(id string) (Entity, error) {
	for _, e := range m.Entities {
		if e.ID == id {
			return e, nil
		}
	}
	return Entity{}, fmt.Errorf("sdkfixture: no entity with id %q", id)
}

// StaticTarget is a replication target of manifest m with selection sel and
// fixed ids, for tests that render views without a database.
func StaticTarget(m Manifest, sel []Selection) (store.Target, error) {
	raw, err := json.Marshal(m)
	if err != nil {
		return store.Target{}, err
	}
	selection := make([]store.Selection, len(sel))
	for i, s := range sel {
		selection[i] = store.Selection{EntityID: s.EntityID, Fields: s.Fields, Relationships: s.Relationships}
	}
	return store.Target{Generation: "0d9e8c7b-6a5f-4e3d-8c2b-1a0f9e8d7c6b", SourceID: "6f1c2a52-8b0e-4d7a-9a51-3c2b1d0e9f84",
		Manifest: raw, Selection: selection}, nil
}
