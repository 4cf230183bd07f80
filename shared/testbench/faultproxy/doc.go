// Package faultproxy puts faults on the wire between the product and the
// servers it talks to, for the local mode's chaos run and for tests: a gRPC
// proxy in front of a Pub/Sub server (refusals, hangs, lost responses,
// connection resets, delays, refused batches, and one chosen call held
// until released: HoldNext) and an HTTP handler in front of a BigQuery REST server
// (slow answers, 5xx). The product reaches them as it reaches Google: by
// address. It is never deployed.
package faultproxy
