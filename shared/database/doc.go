// Package database opens the workspaces' ontology databases: one small pgx
// pool per workspace (4 connections unless the registry says otherwise,
// since the ontology service keeps only a handful on the same instance),
// created on first use and reused by every later invocation of the same
// process. A Cloud SQL database is reached through cloudsqlconn with IAM
// database login and lazy certificate refresh (right for serverless, where
// the CPU may be throttled between requests), over private IP when the
// registry says so; a url database is dialled directly.
package database
