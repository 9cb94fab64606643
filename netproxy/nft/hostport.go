package nft

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// HostPort is one container port published on the node. The Table DNATs
// it from the node's addresses (hostPortRule) and masquerades pods that
// reach it (hairpinRule): after DNAT, a pod reaching its own hostPort
// would get a packet from itself, which it drops as martian, and another
// pod on the bridge would get a reply straight over the bridge that
// bypasses the reverse DNAT unless br_netfilter is loaded. Masquerade
// makes the source the bridge's address, so replies come back through the
// host.
type HostPort struct {
	// Protocol is TCP, UDP or SCTP; empty means TCP.
	Protocol string
	// HostIP limits the port to one local address; the zero value means
	// every local address.
	HostIP netip.Addr
	// HostPort is the port on the node.
	HostPort uint16
	// PodIP is the pod's address.
	PodIP netip.Addr
	// ContainerPort is the port inside the pod.
	ContainerPort uint16
}

// String returns the hostPort as "tcp [hostIP]:port->podIP:port".
func (h HostPort) String() string {
	host := fmt.Sprintf(":%d", h.HostPort)
	if h.HostIP.IsValid() {
		host = netip.AddrPortFrom(h.HostIP, h.HostPort).String()
	}
	return fmt.Sprintf("%s %s->%s", strings.ToLower(cmp.Or(h.Protocol, "TCP")), host, netip.AddrPortFrom(h.PodIP, h.ContainerPort))
}

// normalize checks hostPorts and returns them sorted, with protocols in
// upper case, addresses unmapped and duplicates dropped.
func normalize(hostPorts []HostPort) ([]HostPort, error) {
	out := make([]HostPort, 0, len(hostPorts))
	for _, hp := range hostPorts {
		hp.Protocol = strings.ToUpper(cmp.Or(hp.Protocol, "TCP"))
		hp.PodIP = hp.PodIP.Unmap()
		hp.HostIP = hp.HostIP.Unmap()
		if hp.HostIP.IsUnspecified() {
			hp.HostIP = netip.Addr{} // 0.0.0.0 means any, as in Kubernetes
		}
		if _, ok := l4proto[hp.Protocol]; !ok {
			return nil, fmt.Errorf("hostPort %s: protocol %q: want TCP, UDP or SCTP", hp, hp.Protocol)
		}
		if hp.HostPort == 0 || hp.ContainerPort == 0 {
			return nil, fmt.Errorf("hostPort %s: host and container port must be set", hp)
		}
		if !hp.PodIP.IsValid() {
			return nil, fmt.Errorf("hostPort %s: pod IP is not set", hp)
		}
		if hp.HostIP.IsValid() && hp.HostIP.Is4() != hp.PodIP.Is4() {
			return nil, fmt.Errorf("hostPort %s: host IP and pod IP are of different families", hp)
		}
		out = append(out, hp)
	}
	slices.SortStableFunc(out, func(a, b HostPort) int {
		return cmp.Or(
			cmp.Compare(a.Protocol, b.Protocol),
			a.HostIP.Compare(b.HostIP),
			cmp.Compare(a.HostPort, b.HostPort),
			a.PodIP.Compare(b.PodIP),
			cmp.Compare(a.ContainerPort, b.ContainerPort),
		)
	})
	return slices.CompactFunc(out, func(a, b HostPort) bool {
		return a.Protocol == b.Protocol && a.HostIP == b.HostIP && a.HostPort == b.HostPort &&
			a.PodIP.Is4() == b.PodIP.Is4()
	}), nil
}

// l4proto maps the protocols a hostPort, a map key or a rule may name to
// their IP protocol numbers.
var l4proto = map[string]byte{"TCP": unix.IPPROTO_TCP, "UDP": unix.IPPROTO_UDP, "SCTP": unix.IPPROTO_SCTP}

// ProtocolNumber returns the IP protocol number of TCP, UDP or SCTP (in
// upper case); ok is false for any other name.
func ProtocolNumber(name string) (n byte, ok bool) {
	n, ok = l4proto[name]
	return n, ok
}

// What follows is shared by the netlink translation (netlink.go): the
// table, the socket buffers, and the expressions of the simple matches.

// Available reports whether this kernel (or emulator) speaks nftables
// netlink: it opens and closes a NETLINK_NETFILTER socket. qemu-user, for
// one, refuses it with EPROTONOSUPPORT.
func Available() error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return fmt.Errorf("NETLINK_NETFILTER socket: %w", err)
	}
	unix.Close(fd)
	return nil
}

// table is the outpost table as google/nftables names it.
func table() *nftables.Table {
	return &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
}

// Offsets into the network header.
const (
	ip4SaddrOffset = 12
	ip4DaddrOffset = 16
	ip6SaddrOffset = 8
	ip6DaddrOffset = 24
	thDportOffset  = 2 // destination port in TCP, UDP and SCTP headers
)

// matchFamily is `meta nfproto ipv4|ipv6`, needed before any address match
// in an inet table.
func matchFamily(is4 bool) []expr.Any {
	proto := byte(unix.NFPROTO_IPV6)
	if is4 {
		proto = unix.NFPROTO_IPV4
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

// matchAddr is `ip saddr|daddr <op> prefix`.
func matchAddr(dst bool, op expr.CmpOp, p netip.Prefix) []expr.Any {
	is4 := p.Addr().Is4()
	off := uint32(ip4SaddrOffset)
	switch {
	case is4 && dst:
		off = ip4DaddrOffset
	case !is4 && dst:
		off = ip6DaddrOffset
	case !is4:
		off = ip6SaddrOffset
	}
	size := uint32(p.Addr().BitLen() / 8)
	exprs := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: size}}
	if p.Bits() < p.Addr().BitLen() {
		mask := make([]byte, size)
		for i := range p.Bits() {
			mask[i/8] |= 0x80 >> (i % 8)
		}
		exprs = append(exprs, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size, Mask: mask, Xor: make([]byte, size)})
	}
	return append(exprs, &expr.Cmp{Op: op, Register: 1, Data: p.Masked().Addr().AsSlice()})
}

// matchPort is `meta l4proto <proto> th dport <port>`.
func matchPort(protocol string, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{l4proto[protocol]}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: thDportOffset, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
	}
}

// ipsDstNAT is IPS_DST_NAT, the conntrack status bit of a DNATed connection.
const ipsDstNAT = 1 << 5

// matchDNATed is `ct status dnat`.
func matchDNATed() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, ipsDstNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}
