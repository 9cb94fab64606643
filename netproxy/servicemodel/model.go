package servicemodel

import (
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// ServicePort is one port of one Service as the proxy programs it: the
// addresses it is reached on and the endpoints behind it. It is built from
// the store (Services, EndpointSlices, local pods) and rendered into
// nftables rules by netproxy/nft.
type ServicePort struct {
	// Namespace and Name are the Service's; PortName is the port's name
	// (may be empty for a single-port Service).
	Namespace, Name, PortName string
	// Protocol is TCP, UDP or SCTP.
	Protocol string
	// ClusterIPs are the Service's cluster addresses (IPv4 and/or IPv6).
	ClusterIPs []netip.Addr
	// Port is the Service port.
	Port uint16
	// NodePort is the port on the node's addresses; 0 for none.
	NodePort uint16
	// ExternalIPs are spec.externalIPs; LoadBalancerIPs are
	// status.loadBalancer.ingress[].ip.
	ExternalIPs, LoadBalancerIPs []netip.Addr
	// AffinityTimeout is the ClientIP session affinity timeout; zero means
	// no affinity.
	AffinityTimeout time.Duration
	// InternalLocal is internalTrafficPolicy Local: cluster-IP traffic
	// goes only to endpoints on this node.
	InternalLocal bool
	// ExternalLocal is externalTrafficPolicy Local: NodePort, external and
	// load-balancer traffic goes only to endpoints on this node and keeps
	// the client's source address.
	ExternalLocal bool
	// Endpoints are the backends, sorted by address then port, without
	// duplicates.
	Endpoints []Endpoint
}

// Endpoint is one backend of a ServicePort.
type Endpoint struct {
	Addr netip.Addr
	Port uint16
	// Ready, Serving and Terminating are the EndpointSlice conditions
	// (for endpoints of this node's pods, as the agent sees them now).
	Ready, Serving, Terminating bool
	// Local is true when the endpoint is a pod on this node.
	Local bool
}

// String returns "ns/name/proto/port" (port name when set, else number),
// the readable part of the service's chain names.
func (s ServicePort) String() string {
	port := s.PortName
	if port == "" {
		port = fmt.Sprint(s.Port)
	}
	return s.Namespace + "/" + s.Name + "/" + strings.ToLower(s.Protocol) + "/" + port
}

// Usable returns the endpoints traffic may go to: the ready ones, or when
// none is ready the serving-and-terminating ones (as kube-proxy does).
// With local set, only endpoints on this node count.
func (s ServicePort) Usable(local bool) []Endpoint {
	var ready, terminating []Endpoint
	for _, e := range s.Endpoints {
		if local && !e.Local {
			continue
		}
		switch {
		case e.Ready:
			ready = append(ready, e)
		case e.Serving && e.Terminating:
			terminating = append(terminating, e)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return terminating
}
