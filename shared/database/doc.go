// Package database opens the workspaces' ontology databases: one small pgx
// pool per workspace (Config.MaxConns connections unless the registry says
// otherwise, since the ontology service keeps only a handful on the same
// instance),
// created on first use and reused by every later invocation of the same
// process. A Cloud SQL database is reached through cloudsqlconn with IAM
// database login and lazy certificate refresh (right for serverless, where
// the CPU may be throttled between requests), over private IP when the
// registry says so; a url database is dialled directly.
//
// Connections are bounded three ways: a pool's size per workspace
// database, MaxOpen pools per process, and ServerMaxConns connections per
// PostgreSQL server however many workspace databases live there (server.go:
// max_connections is the server's, and one Cloud SQL instance holds many
// workspace databases). TryAcquireAll takes several workspaces' pools at
// once or none, so that callers that hold several cannot wait on each
// other.
package database
