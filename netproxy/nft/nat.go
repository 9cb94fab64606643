// Package nft programs outpost's nftables table (`outpost`, family inet)
// through github.com/google/nftables; it is the only package that may
// import that library. Today it holds the pod network's NAT: masquerade
// of pod egress and DNAT for hostPorts. Every change is one netlink batch,
// which the kernel applies atomically.
package nft

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/outpost-edge/outpost/netproxy"
)

// Chain names. Base chains are named type-hook.
const (
	// ChainNATPostrouting masquerades pod egress and hairpin hostPort
	// traffic.
	ChainNATPostrouting = "nat-postrouting"
	// ChainNATPrerouting DNATs hostPort traffic arriving at the node.
	ChainNATPrerouting = "nat-prerouting"
	// ChainNATOutput DNATs hostPort traffic the node itself sends.
	ChainNATOutput = "nat-output"
)

// Base chain priorities, numeric: nft 1.0.6 rejects `priority dstnat` in
// an output hook, and numbers read the same everywhere.
const (
	priorityNATPostrouting = 100  // srcnat
	priorityNATPrerouting  = -100 // dstnat
	priorityNATOutput      = -100 // dstnat
)

// socketBuffer is the netlink socket's send and receive buffer size. The
// whole batch is one sendmsg, which fails with EMSGSIZE beyond the send
// buffer, and the kernel's acknowledgements overflow a small receive buffer
// with ENOBUFS.
const socketBuffer = 8 << 20

// HostPort is one container port published on the node.
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

// NATConfig says what the NAT rules cover.
type NATConfig struct {
	// PodCIDR is the node's pod address range; traffic from it to
	// anywhere outside it is masqueraded.
	PodCIDR netip.Prefix
	// NetNS is a file descriptor of the network namespace to program;
	// zero means the current one.
	NetNS int
}

// NAT owns the pod-network NAT chains of the outpost table.
type NAT struct {
	cfg NATConfig
	mu  sync.Mutex // one batch at a time
}

// NewNAT checks cfg and returns a NAT. It does not touch the kernel.
func NewNAT(cfg NATConfig) (*NAT, error) {
	if !cfg.PodCIDR.IsValid() {
		return nil, fmt.Errorf("new nat: pod CIDR is not set")
	}
	if cfg.PodCIDR.Masked() != cfg.PodCIDR {
		return nil, fmt.Errorf("new nat: pod CIDR %s: not a network address (want %s)", cfg.PodCIDR, cfg.PodCIDR.Masked())
	}
	if cfg.NetNS < 0 {
		return nil, fmt.Errorf("new nat: netns fd %d: negative", cfg.NetNS)
	}
	return &NAT{cfg: cfg}, nil
}

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

// Sync makes the outpost table hold exactly the NAT for hostPorts, in one
// atomic batch: masquerade of traffic from the pod CIDR to destinations
// outside it; per hostPort a DNAT in prerouting and in output (only for
// local destinations, `fib daddr type local`, and not loopback ones); and
// masquerade of hairpin traffic, pods (the hostPort's own or another)
// reaching a hostPort. Sync is
// idempotent. Duplicate hostPorts (same protocol, host IP and port) keep
// the first in sorted order.
func (n *NAT) Sync(hostPorts []HostPort) error {
	ports, err := normalize(hostPorts)
	if err != nil {
		return fmt.Errorf("sync nat: %w", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	c, err := n.conn()
	if err != nil {
		return fmt.Errorf("sync nat: %w", err)
	}
	t := table()
	// Add-then-delete removes whatever the table held (without failing
	// when it did not exist); the rest of the batch rebuilds it.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	post := c.AddChain(natChain(t, ChainNATPostrouting, nftables.ChainHookPostrouting, priorityNATPostrouting))
	pre := c.AddChain(natChain(t, ChainNATPrerouting, nftables.ChainHookPrerouting, priorityNATPrerouting))
	out := c.AddChain(natChain(t, ChainNATOutput, nftables.ChainHookOutput, priorityNATOutput))
	for _, hp := range ports {
		c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: hairpinMasq(n.cfg.PodCIDR, hp)})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: egressMasq(n.cfg.PodCIDR)})
	for _, hp := range ports {
		c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: dnat(hp, false)})
		c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: dnat(hp, true)})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("sync nat: apply table %s: %w", netproxy.TableName, err)
	}
	return nil
}

// Delete removes the outpost table. A missing table is not an error.
func (n *NAT) Delete() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	c, err := n.conn()
	if err != nil {
		return fmt.Errorf("delete table %s: %w", netproxy.TableName, err)
	}
	t := table()
	c.AddTable(t) // so the delete cannot fail with ENOENT
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("delete table %s: %w", netproxy.TableName, err)
	}
	return nil
}

// conn returns an nftables connection to the configured netns whose
// socket has large buffers.
func (n *NAT) conn() (*nftables.Conn, error) {
	opts := []nftables.ConnOption{nftables.WithSockOptions(setBuffers)}
	if n.cfg.NetNS > 0 {
		opts = append(opts, nftables.WithNetNSFd(n.cfg.NetNS))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("open nftables: %w", err)
	}
	return c, nil
}

// setBuffers raises the socket's buffers to socketBuffer. The FORCE
// options (CAP_NET_ADMIN) go past net.core.rmem_max/wmem_max; without the
// capability the plain options apply, capped by those limits.
func setBuffers(c *mnl.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	var forced error
	err = raw.Control(func(fd uintptr) {
		forced = errors.Join(
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, socketBuffer),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, socketBuffer),
		)
	})
	if err == nil && forced == nil {
		return nil
	}
	if err := c.SetReadBuffer(socketBuffer); err != nil {
		return fmt.Errorf("set netlink receive buffer: %w", err)
	}
	if err := c.SetWriteBuffer(socketBuffer); err != nil {
		return fmt.Errorf("set netlink send buffer: %w", err)
	}
	return nil
}

func table() *nftables.Table {
	return &nftables.Table{Name: netproxy.TableName, Family: nftables.TableFamilyINet}
}

func natChain(t *nftables.Table, name string, hook *nftables.ChainHook, prio int32) *nftables.Chain {
	return &nftables.Chain{
		Name:     name,
		Table:    t,
		Type:     nftables.ChainTypeNAT,
		Hooknum:  hook,
		Priority: nftables.ChainPriorityRef(nftables.ChainPriority(prio)),
	}
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

var l4proto = map[string]byte{"TCP": unix.IPPROTO_TCP, "UDP": unix.IPPROTO_UDP, "SCTP": unix.IPPROTO_SCTP}

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

// matchLocalDest is `fib daddr type local`.
func matchLocalDest() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, unix.RTN_LOCAL)},
	}
}

// egressMasq is `ip saddr <cidr> ip daddr != <cidr> masquerade fully-random`.
func egressMasq(cidr netip.Prefix) []expr.Any {
	e := matchFamily(cidr.Addr().Is4())
	e = append(e, matchAddr(false, expr.CmpOpEq, cidr)...)
	e = append(e, matchAddr(true, expr.CmpOpNeq, cidr)...)
	return append(e, &expr.Masq{FullyRandom: true})
}

// hairpinMasq is `ip saddr <podCIDR> ip daddr <podIP> <proto> dport
// <containerPort> ct status dnat masquerade`. After DNAT, a pod reaching its
// own hostPort would get a packet from itself, which it drops as martian;
// another pod on the bridge would get a reply straight over the bridge that
// bypasses the reverse DNAT unless br_netfilter is loaded. Masquerade makes
// the source the bridge's address, so replies come back through the host.
func hairpinMasq(cidr netip.Prefix, hp HostPort) []expr.Any {
	pod := netip.PrefixFrom(hp.PodIP, hp.PodIP.BitLen())
	e := matchFamily(hp.PodIP.Is4())
	if cidr.Addr().Is4() == hp.PodIP.Is4() {
		e = append(e, matchAddr(false, expr.CmpOpEq, cidr)...)
	} else {
		e = append(e, matchAddr(false, expr.CmpOpEq, pod)...)
	}
	e = append(e, matchAddr(true, expr.CmpOpEq, pod)...)
	e = append(e, matchPort(hp.Protocol, hp.ContainerPort)...)
	e = append(e, matchDNATed()...)
	return append(e, &expr.Masq{})
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

// dnat is `fib daddr type local [ip daddr <hostIP>] <proto> dport <hostPort>
// dnat to <podIP>:<containerPort>`; in the output chain loopback
// destinations are left alone (a 127.0.0.1 source cannot leave through the
// bridge).
func dnat(hp HostPort, output bool) []expr.Any {
	is4 := hp.PodIP.Is4()
	e := matchFamily(is4)
	e = append(e, matchLocalDest()...)
	if output {
		lo := netip.MustParsePrefix("127.0.0.0/8")
		if !is4 {
			lo = netip.MustParsePrefix("::1/128")
		}
		e = append(e, matchAddr(true, expr.CmpOpNeq, lo)...)
	}
	if hp.HostIP.IsValid() {
		e = append(e, matchAddr(true, expr.CmpOpEq, netip.PrefixFrom(hp.HostIP, hp.HostIP.BitLen()))...)
	}
	e = append(e, matchPort(hp.Protocol, hp.HostPort)...)
	family := uint32(unix.NFPROTO_IPV6)
	if is4 {
		family = unix.NFPROTO_IPV4
	}
	return append(e,
		&expr.Immediate{Register: 1, Data: hp.PodIP.AsSlice()},
		&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, hp.ContainerPort)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: family, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	)
}
