// Package store is the node's truth: a bbolt file holding the desired pods,
// services, endpoint slices, config maps and secrets, IPAM allocations,
// per-container restart state and the status journal.
//
// # Basics
//
// Every source of desired state (the API server watch, MQTT, the static
// manifest directory) writes records here, each tagged with its Source.
// Reconcilers read only from here and learn of changes through Subscribe,
// whose notifications are coalesced per kind. Observed status goes into the
// journal, which keeps only the newest value per object; a sink reads
// Pending entries and Acks each one it has delivered.
//
// Values are stored as a small envelope (format byte, source byte) around
// the object's Kubernetes protobuf encoding: measured at roughly half the
// size of JSON and several times faster to decode (see BenchmarkCodec).
//
// # Caveats
//
// Values returned by accessors are decoded copies; bbolt's own byte slices
// never leave a transaction. Writes go through DB.Batch, so concurrent
// writers share one fsync; a write is durable when its method returns.
// The file never shrinks on its own.
package store
