// Package mqtt syncs the node through an MQTT broker, for sites that reach
// the world only that way: the desired objects the bridge (sync/bridge)
// publishes as retained messages go into the store, and the store's
// status journal drains into the node's status topics.
//
// # Basics
//
// The store is the node's truth; this package is one source and one sink
// of it, like sync/kube, and the agent never needs to know which one it
// has. A broker that cannot be reached only pauses it.
//
// Everything is under the topic prefix outpost/v1/ (topic.go). Every
// message but the online flag is an Envelope (envelope.go): a small
// versioned header (kind, generation, encoding) around the object's
// Kubernetes protobuf encoding. Order is decided by the generation, never
// by the order of delivery: a desired object older than the stored one is
// ignored, and a status carries the journal's sequence number.
//
// # Caveats
//
// The broker's queue is not trusted: mosquitto drops queued messages past
// max_queued_messages silently and saves retained ones only every
// autosave_interval. So on every connect the node reads the retained
// indexes (index.go), which list every desired object and its generation,
// and fetches only what differs from the store.
//
// paho's own store and its tokens are not trusted either: the journal is
// the outbox, an entry is acknowledged only after a PUBACK on the
// connection it was published on, every wait has a timeout, handlers only
// hand off, and the client is made anew for every connection, so no state
// of a dead connection (paho#552, #613) survives into the next.
package mqtt
