// Package bridge is the cloud side of the MQTT sync (`outpost bridge`):
// for every node that syncs over MQTT it does, against the API server,
// what the agent does over its own link: it registers the Node from the
// node's status topic and renews its Lease while the node's online topic
// says true, patches pod statuses and makes mirror pods from the status
// topics, and publishes the node's desired objects (its pods, the config
// maps and secrets they use) and the cluster's Services and
// EndpointSlices as retained messages.
//
// # Basics
//
// What a kubelet tells the API server is implemented once, in sync/kube:
// for each MQTT node the bridge runs sync/kube's Syncer over a store of
// its own, in a scratch directory, with the MQTT link standing in for the
// node: the pods watch fills the store the bridge publishes from, and the
// statuses the node publishes go into the store's journal, which the
// Syncer drains into status patches as it does on a node.
//
// # Caveats
//
// The bridge keeps no state of its own: the scratch directory is emptied
// at start and rebuilt from the API server and the broker. What is
// retained on the broker is read back from its indexes (which hold a hash
// of each object), so a restarted bridge publishes only what changed, and
// a broker that lost its retained messages gets everything again.
// Secrets go sealed to each node's key, never in clear (held until the
// node published its key); the pods' tokens, which the API server gives
// once, a signing bridge keeps on the broker in copies sealed to a key
// derived from its signing key, and reads back after a restart.
package bridge
