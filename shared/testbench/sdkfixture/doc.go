// Package sdkfixture builds SDK-shaped ontology databases for tests and the
// local mode: what the ontology SDK's migration runner installs, and what its
// writer commits.
//
// # What it builds
//
// Install creates, in an empty database, the catalog row with its manifest,
// each entity's table, history table and join tables, and then the
// replication schema exactly as the SDK's REPLICATION_DDL and
// replicationEntityDdl build it: at protocol 3 as SDK 0.12.0 does (seed 001),
// at protocol 4 as SDK 0.25.0 does (seed 000: capture functions that enqueue
// delivery rows, the revision sequence, the protocol floor). Upgrade takes a
// protocol-3 database to protocol 4 the way the SDK's migration does, keeping
// its targets and receipts, so that its targets need a backfill.
//
// StartGeneration starts a generation with its baseline events; Writer
// commits creates, updates, deletes, links and unlinks through the SDK's
// write protocol, so the capture triggers record events.
//
// Where the seeds do not show the SDK's code (the business and history table
// layout, the protocol-4 baseline), the fixture documents what it assumes.
// The delivery code must not depend on those assumptions: it finds history
// tables through their capture triggers, never by name.
//
// The Demo manifest has three business entities with every property storage
// type, a one-relationship and a many-relationship, and the built-in user
// entity, which is never replicated. V3Template and V4Template build it for
// pgtest.
//
// It serves tests and the local mode, and is never deployed.
package sdkfixture
