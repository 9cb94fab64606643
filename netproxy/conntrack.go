package netproxy

import (
	"fmt"
	"net/netip"
)

// UDPFlowFilter selects UDP conntrack flows; a zero field matches
// anything.
type UDPFlowFilter struct {
	// OrigDst and OrigDstPort are the address and port the client sent
	// to (a cluster, external or load-balancer IP, or a node port).
	OrigDst     netip.Addr
	OrigDstPort uint16
	// ReplySrc is the address replies come from: the endpoint a flow was
	// DNATed to.
	ReplySrc netip.Addr
}

// String returns the filter as "udp dst=…:port reply-src=…".
func (f UDPFlowFilter) String() string {
	s := fmt.Sprintf("udp dst=%v:%d", f.OrigDst, f.OrigDstPort)
	if f.ReplySrc.IsValid() {
		s += " reply-src=" + f.ReplySrc.String()
	}
	return s
}
