// Package identity verifies the runtime identity tokens that wake the drain.
//
// The ontology service calls the drain with x-segmentstream-runtime-identity,
// a JWT of the workspace runtime, and x-segmentstream-organization-id. A
// Verifier checks the token's signature against the issuer's JWKS, its
// algorithm (asymmetric ones only: never none, never HMAC), issuer,
// audience, expiry, lifetime (exp − iat at most 24 h by default), its typ
// header when the registry sets identity.token_type, and reads the
// organisation claim the registry may name; Authorize then checks that its
// subject is the workspace's runtime, the organisation header the
// workspace's organisation, and the claim, when there is one, too.
//
// # Keys for a fleet
//
// The JWKS is fetched on first use and kept. Keys older than KeysTTL (10
// minutes) are refreshed in the background: requests go on with the keys
// held and never wait for the issuer while those keys are usable. A token
// with an unknown key id (the issuer rotated its keys) waits for a refetch,
// at most one per RefetchInterval (30 s) shared by every request waiting,
// so forged key ids cost the issuer one fetch per interval, also while it
// fails. The interval counts from the last fetch an unknown key id caused,
// not from the first fetch or a background refresh, so that a rotation
// right after one is taken at once; a token with another unknown key id
// within the interval is refused (the drain's 401). Failed fetches back off from 1 s to RefetchInterval. Keys that
// could not be refreshed for MaxStaleness (1 hour) are no longer trusted:
// tokens are then refused as unverifiable (ErrKeysUnavailable, the drain's
// 503) until the issuer answers.
package identity
