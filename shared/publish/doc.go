// Package publish sends one batch of replication events to Pub/Sub as one
// Publish RPC.
//
// It uses the low-level TopicAdminClient.Publish of
// cloud.google.com/go/pubsub/v2, which stores every message of a request and
// returns one id for each, or returns one error. (The high-level Publisher
// splits batches and reports per message, so it cannot say "all or
// nothing".) The library's default of retrying for up to a minute is
// replaced by a single attempt with a bounded deadline: the drain is woken
// again and the verifier sweeps, so a failure is better reported fast.
//
// PUBSUB_EMULATOR_HOST is honoured by the client.
package publish
