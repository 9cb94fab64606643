// Package kube syncs the node with a Kubernetes API server: it registers the
// Node and renews its Lease, watches the pods bound to the node (and the
// config maps and secrets they use), and the Services and EndpointSlices
// of all namespaces for the service proxy, into the store, and drains the
// store's status journal into pod status patches and mirror pods.
//
// # Basics
//
// The store is the node's truth; this package is one source and one sink of
// it. Nothing here runs a container: an unreachable API server only pauses
// the sink and the watches, and the pods keep running from the store.
//
// Requests go through client-go's REST client over a scheme that registers
// only core/v1, coordination/v1, discovery/v1, certificates/v1 and
// authentication/v1 (token requests), with
// protobuf on the wire; the generated typed clients are never linked.
//
// # Caveats
//
// Objects are stored without resourceVersion and managedFields, and pods
// without status, so a status patch of ours that the watch echoes back
// writes nothing to disk.
// The resourceVersion a watch reached is persisted when a stored object
// changes, not for every event; a stale one costs a relist at most.
package kube
