// Package identity verifies the runtime identity tokens that wake the drain.
//
// The ontology service calls the drain with x-segmentstream-runtime-identity,
// a JWT of the workspace runtime, and x-segmentstream-organization-id. A
// Verifier checks the token's signature against the issuer's JWKS (fetched
// and cached, refetched at most every 30 s for an unknown key id), its
// algorithm (asymmetric ones only: never none, never HMAC), issuer, audience
// and expiry; Authorize then checks that its subject is the workspace's
// runtime and the organisation header the workspace's organisation.
//
// Issuer is a local issuer (a key pair and its JWKS) for the local mode and
// tests.
package identity
