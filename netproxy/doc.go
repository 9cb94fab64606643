// Package netproxy holds no code: its subpackages program the node's
// network, and take what they program only from the store.
//
//   - servicemodel: the Services and endpoints the proxy programs
//     (ServicePort), built from the store's Services, EndpointSlices and
//     this node's pods (Build, and Index for what changed). A new Service
//     field starts here.
//   - proxy: outpost's kube-proxy, the loop that reads the store, builds
//     the model, keeps the nftables table equal to it and deletes the UDP
//     conntrack flows a change made stale (staleflows.go).
//   - nft: the one nftables table (inet outpost): Table, which renders
//     ServicePorts and hostPorts into rules and applies only the
//     difference, the Tx language of chains, rules, maps and sets, and
//     Netlink, the only user of github.com/google/nftables.
//   - nfttest: test support for nft: Fake, an in-memory table, and Trace,
//     which pushes a packet through its rules. Only tests import it.
//   - podnet: the pod network (the outpost0 bridge, each pod's netns and
//     veth, IPAM in the store), and, as the only user of
//     vishvananda/netlink, the deletion of UDP conntrack flows
//     (udpflows.go).
//
// proxy imports servicemodel, nft and podnet (for its conntrack filter);
// nft imports servicemodel; nfttest imports nft; podnet and servicemodel
// import none of the others. cmd/outpost wires proxy and podnet into the
// agent.
package netproxy
