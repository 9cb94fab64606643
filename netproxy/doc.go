// Package netproxy is where outpost programs the node's network: Service
// rules in one nftables table (netproxy/nft) and the pod network of bridge,
// veths and IPAM (netproxy/podnet). It reads only from the store. Its
// subpackages arrive with the service-proxy and pod-network capabilities;
// this package holds what they share.
package netproxy
