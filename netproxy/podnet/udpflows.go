package podnet

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// This file deletes the UDP conntrack flows that the service proxy
// (netproxy/proxy, staleflows.go) finds stale: it is here because podnet
// is the one package that talks netlink.

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

// Conntrack deletes the service proxy's stale UDP conntrack flows through
// netlink, in one network namespace.
type Conntrack struct {
	// NetNS is a file descriptor of the namespace; zero means the current
	// one.
	NetNS int
}

// DeleteUDP deletes the UDP flows matching any of filters, in both
// address families.
func (c Conntrack) DeleteUDP(filters []UDPFlowFilter) (int, error) {
	if len(filters) == 0 {
		return 0, nil
	}
	h, err := c.handle()
	if err != nil {
		return 0, err
	}
	defer h.Close()
	var total int
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		var fs []netlink.CustomConntrackFilter
		for _, f := range filters {
			if f.OrigDst.IsValid() && f.OrigDst.Is4() != (fam == unix.AF_INET) ||
				f.ReplySrc.IsValid() && f.ReplySrc.Is4() != (fam == unix.AF_INET) {
				continue
			}
			nf := &netlink.ConntrackFilter{}
			if err := nf.AddProtocol(unix.IPPROTO_UDP); err != nil {
				return total, fmt.Errorf("conntrack filter %s: %w", f, err)
			}
			if f.OrigDst.IsValid() {
				if err := nf.AddIP(netlink.ConntrackOrigDstIP, net.IP(f.OrigDst.AsSlice())); err != nil {
					return total, fmt.Errorf("conntrack filter %s: %w", f, err)
				}
			}
			if f.OrigDstPort != 0 {
				if err := nf.AddPort(netlink.ConntrackOrigDstPort, f.OrigDstPort); err != nil {
					return total, fmt.Errorf("conntrack filter %s: %w", f, err)
				}
			}
			if f.ReplySrc.IsValid() {
				if err := nf.AddIP(netlink.ConntrackReplySrcIP, net.IP(f.ReplySrc.AsSlice())); err != nil {
					return total, fmt.Errorf("conntrack filter %s: %w", f, err)
				}
			}
			fs = append(fs, nf)
		}
		if len(fs) == 0 {
			continue
		}
		n, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, fs...)
		total += int(n)
		if err != nil {
			return total, fmt.Errorf("delete udp conntrack flows: %w", err)
		}
	}
	return total, nil
}

func (c Conntrack) handle() (*netlink.Handle, error) {
	if c.NetNS > 0 {
		h, err := netlink.NewHandleAt(netns.NsHandle(c.NetNS), unix.NETLINK_NETFILTER)
		if err != nil {
			return nil, fmt.Errorf("conntrack netlink handle: %w", err)
		}
		return h, nil
	}
	h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("conntrack netlink handle: %w", err)
	}
	return h, nil
}
