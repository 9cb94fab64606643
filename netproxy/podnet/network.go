// Package podnet gives every pod its network on the node: a named network
// namespace, a veth pair whose host side hangs off the node's bridge
// (outpost0), and an IPv4 address from the node's pod CIDR, with a
// default route through the bridge's gateway address.
//
// Address allocations (IPAM) live in the store, keyed by pod UID, so a
// restarted agent finds the addresses it handed out before; every
// operation is idempotent, so the agent can simply repeat it after a
// crash. podnet is the one package that talks to the kernel through
// vishvananda/netlink and netns, so it also deletes the service proxy's
// stale UDP conntrack flows (Conntrack, udpflows.go). It prefers netlink
// handles bound to a namespace over switching threads, and when it must
// switch a thread it never returns one to the scheduler in the wrong
// namespace.
package podnet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/outpost-edge/outpost/store"
)

// Defaults for the zero values of Config.
const (
	// DefaultBridgeName is the Linux bridge pods attach to.
	DefaultBridgeName = "outpost0"
	// DefaultNetnsDir is where pod netns files are bind-mounted, as for
	// `ip netns`.
	DefaultNetnsDir = "/run/netns"
	// DefaultNetnsPrefix starts every pod netns name.
	DefaultNetnsPrefix = "outpost-"
	// DefaultMTU is the MTU of the bridge and the veths.
	DefaultMTU = 1500
)

// ipForwardPath is the IPv4 forwarding switch of the opening thread's netns.
const ipForwardPath = "/proc/sys/net/ipv4/ip_forward"

// bridgeNFPaths make bridged IPv4 and IPv6 traffic pass the nftables
// hooks; they exist once br_netfilter is loaded.
var bridgeNFPaths = []string{
	"/proc/sys/net/bridge/bridge-nf-call-iptables",
	"/proc/sys/net/bridge/bridge-nf-call-ip6tables",
}

// setSysctl writes 1 to a /proc/sys file that does not hold it yet.
func setSysctl(path string) error {
	if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == "1" {
		return nil
	} else if errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.WriteFile(path, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("set %s: %w", path, err)
	}
	return nil
}

// Config says what the pod network looks like. Every field but PodCIDR
// has a default.
type Config struct {
	// PodCIDR is the node's pod address range, e.g. 10.42.0.0/24 (IPv4,
	// at most a /30). Its first address (.1) is the bridge's gateway
	// address; pods get the addresses after it, up to but excluding
	// broadcast.
	PodCIDR netip.Prefix
	// BridgeName is the Linux bridge pods attach to (default "outpost0").
	BridgeName string
	// NetnsDir is where named pod netns are bind-mounted (default
	// "/run/netns").
	NetnsDir string
	// NetnsPrefix starts every pod netns name (default "outpost-"); the
	// name is the prefix plus the first 12 characters of the pod UID
	// with its dashes removed.
	NetnsPrefix string
	// MTU of the bridge and of both ends of every veth (default 1500).
	MTU int
	// HostNetNS is the namespace that plays "the host": the bridge and
	// host-side veths live there and forwarding is enabled there. The
	// zero value (or netns.None()) means the current process's netns;
	// tests pass a namespace they created so the real host is never
	// touched. The Network does not close it.
	HostNetNS netns.NsHandle
}

// Deps are the Network's collaborators.
type Deps struct {
	// Store holds the IPAM allocations. Required.
	Store *store.Store
	// Log receives state transitions (Info) and no-op checks (Debug);
	// nil discards.
	Log *slog.Logger
}

// Result is a pod's network as Setup made or found it.
type Result struct {
	// NetNSPath is the bind-mounted netns file, for the OCI spec.
	NetNSPath string
	// IP is the pod's address on eth0.
	IP netip.Addr
	// Gateway is the bridge's address, the pod's default route.
	Gateway netip.Addr
	// Prefix is the pod CIDR the address belongs to.
	Prefix netip.Prefix
}

// Network sets up and tears down pod networks on one node. Its methods
// are safe for concurrent use; calls for the same pod are serialized.
type Network struct {
	cfg   Config
	rng   addressRange
	store *store.Store
	log   *slog.Logger

	ipamMu sync.Mutex // one allocation at a time: choose, then reserve
	pods   keyedMutex // one Setup/Teardown per pod at a time

	dirMu    sync.Mutex
	dirReady bool // NetnsDir exists and is a shared mount
}

// New checks cfg and returns a Network. It starts nothing and touches
// neither the kernel nor the store.
func New(cfg Config, deps Deps) (*Network, error) {
	if deps.Store == nil {
		return nil, fmt.Errorf("new pod network: store is required")
	}
	rng, err := newAddressRange(cfg.PodCIDR)
	if err != nil {
		return nil, fmt.Errorf("new pod network: %w", err)
	}
	if cfg.BridgeName == "" {
		cfg.BridgeName = DefaultBridgeName
	}
	if len(cfg.BridgeName) > unix.IFNAMSIZ-1 || strings.ContainsAny(cfg.BridgeName, "/ \x00") {
		return nil, fmt.Errorf("new pod network: bridge name %q: not a valid interface name", cfg.BridgeName)
	}
	if cfg.NetnsDir == "" {
		cfg.NetnsDir = DefaultNetnsDir
	}
	if cfg.NetnsPrefix == "" {
		cfg.NetnsPrefix = DefaultNetnsPrefix
	}
	if strings.ContainsAny(cfg.NetnsPrefix, "/\x00") {
		return nil, fmt.Errorf("new pod network: netns prefix %q: contains a path separator or NUL", cfg.NetnsPrefix)
	}
	if cfg.MTU == 0 {
		cfg.MTU = DefaultMTU
	}
	if cfg.MTU < 68 || cfg.MTU > 65535 {
		return nil, fmt.Errorf("new pod network: mtu %d: want 68 to 65535", cfg.MTU)
	}
	log := deps.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Network{cfg: cfg, rng: rng, store: deps.Store, log: log}, nil
}

// Gateway returns the bridge's address, the first address of the pod CIDR.
func (n *Network) Gateway() netip.Addr { return n.rng.gateway }

// NetNSPath returns where podUID's netns is (or would be) mounted.
func (n *Network) NetNSPath(podUID string) string {
	return filepath.Join(n.cfg.NetnsDir, netnsName(n.cfg.NetnsPrefix, podUID))
}

// EnsureBridge creates the bridge if it is missing, gives it the gateway
// address (and no other IPv4 address), the configured MTU, sets it up
// and enables IPv4 forwarding, all in the host netns. It is idempotent.
func (n *Network) EnsureBridge(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("ensure bridge %s: %w", n.cfg.BridgeName, err)
	}
	host, err := n.hostHandle()
	if err != nil {
		return fmt.Errorf("ensure bridge %s: %w", n.cfg.BridgeName, err)
	}
	defer host.Close()
	if err := n.ensureBridge(host); err != nil {
		return fmt.Errorf("ensure bridge %s: %w", n.cfg.BridgeName, err)
	}
	if err := n.enableForwarding(); err != nil {
		return fmt.Errorf("ensure bridge %s: enable ip forwarding: %w", n.cfg.BridgeName, err)
	}
	return nil
}

func (n *Network) ensureBridge(host *netlink.Handle) error {
	name := n.cfg.BridgeName
	br, err := host.LinkByName(name)
	if isNotFound(err) {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = name
		attrs.MTU = n.cfg.MTU
		attrs.HardwareAddr = bridgeMAC(name)
		if err := host.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create: %w", err)
		}
		n.log.Info("created bridge", "bridge", name)
		br, err = host.LinkByName(name)
	}
	if err != nil {
		return fmt.Errorf("find link: %w", err)
	}
	if br.Type() != "bridge" {
		return fmt.Errorf("link exists but is a %s, not a bridge", br.Type())
	}
	if br.Attrs().MTU != n.cfg.MTU {
		if err := host.LinkSetMTU(br, n.cfg.MTU); err != nil {
			return fmt.Errorf("set mtu %d: %w", n.cfg.MTU, err)
		}
	}
	gw := &netlink.Addr{IPNet: ipNet(n.rng.gateway, n.rng.prefix.Bits())}
	if err := setOnlyAddr(host, br, gw); err != nil {
		return err
	}
	if err := host.LinkSetUp(br); err != nil {
		return fmt.Errorf("set up: %w", err)
	}
	return nil
}

// enableForwarding turns on net.ipv4.ip_forward and, when br_netfilter is
// loaded, the bridge-nf-call sysctls in the host netns.
func (n *Network) enableForwarding() error {
	enable := func() error {
		if err := setSysctl(ipForwardPath); err != nil {
			return err
		}
		// Replies from a Service's endpoint to a pod on the same bridge
		// are bridged, not routed: only br_netfilter takes them through
		// the nftables hooks where conntrack undoes the Service's DNAT.
		for _, p := range bridgeNFPaths {
			err := setSysctl(p)
			if errors.Is(err, os.ErrNotExist) {
				n.log.Warn("br_netfilter is not loaded: a pod reaching a Service whose endpoint is a pod on this node gets no answer; load it (modprobe br_netfilter; the package loads it at boot)")
				break
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	cur, err := n.hostIsCurrent()
	if err != nil {
		return err
	}
	if cur {
		return enable()
	}
	// /proc/sys/net shows the netns of the thread that opens it.
	return inNetNS(n.cfg.HostNetNS, enable)
}

// Setup makes sure podUID has its network: a named netns with loopback
// up, a veth pair whose host side is on the bridge and whose pod side is
// eth0, an address from IPAM on eth0 and a default route via the
// gateway. EnsureBridge must have run. Setup is idempotent: after an
// agent restart it finds what an earlier Setup made, repairs what is
// missing and returns the same address.
func (n *Network) Setup(ctx context.Context, podUID string) (Result, error) {
	if err := checkUID(podUID); err != nil {
		return Result{}, fmt.Errorf("set up pod network: %w", err)
	}
	defer n.pods.lock(podUID)()
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("pod %s: set up network: %w", podUID, err)
	}
	ip, err := n.allocate(podUID)
	if err != nil {
		return Result{}, fmt.Errorf("pod %s: %w", podUID, err)
	}
	path := n.NetNSPath(podUID)
	if err := n.ensureNetNS(path); err != nil {
		return Result{}, fmt.Errorf("pod %s: %w", podUID, err)
	}
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("pod %s: set up network: %w", podUID, err)
	}
	podNS, err := netns.GetFromPath(path)
	if err != nil {
		return Result{}, fmt.Errorf("pod %s: open netns %s: %w", podUID, path, err)
	}
	defer podNS.Close()
	host, err := n.hostHandle()
	if err != nil {
		return Result{}, fmt.Errorf("pod %s: %w", podUID, err)
	}
	defer host.Close()
	pod, err := netlink.NewHandleAt(podNS, unix.NETLINK_ROUTE) // as hostHandle's
	if err != nil {
		return Result{}, fmt.Errorf("pod %s: open netlink in netns %s: %w", podUID, path, err)
	}
	defer pod.Close()
	if err := n.wire(host, pod, podNS, podUID, ip); err != nil {
		return Result{}, fmt.Errorf("pod %s: %w", podUID, err)
	}
	return Result{NetNSPath: path, IP: ip, Gateway: n.rng.gateway, Prefix: n.rng.prefix}, nil
}

// wire connects the pod's netns to the bridge and configures eth0.
func (n *Network) wire(host, pod *netlink.Handle, podNS netns.NsHandle, uid string, ip netip.Addr) error {
	bridge, err := host.LinkByName(n.cfg.BridgeName)
	if err != nil {
		return fmt.Errorf("find bridge %s (has EnsureBridge run?): %w", n.cfg.BridgeName, err)
	}
	lo, err := pod.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find loopback: %w", err)
	}
	if err := pod.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set loopback up: %w", err)
	}
	hostLink, podLink, err := n.ensureVeth(host, pod, podNS, uid, bridge)
	if err != nil {
		return err
	}
	if hostLink.Attrs().MasterIndex != bridge.Attrs().Index {
		if err := host.LinkSetMasterByIndex(hostLink, bridge.Attrs().Index); err != nil {
			return fmt.Errorf("attach veth %s to bridge %s: %w", hostLink.Attrs().Name, n.cfg.BridgeName, err)
		}
	}
	// Hairpin lets the bridge send a frame back out the port it came in
	// on. With br_netfilter loaded, a pod reaching its own hostPort is
	// DNATed and bridged straight back to its own port.
	if err := host.LinkSetHairpin(hostLink, true); err != nil {
		return fmt.Errorf("set hairpin mode on veth %s: %w", hostLink.Attrs().Name, err)
	}
	if hostLink.Attrs().MTU != n.cfg.MTU {
		if err := host.LinkSetMTU(hostLink, n.cfg.MTU); err != nil {
			return fmt.Errorf("set mtu of veth %s: %w", hostLink.Attrs().Name, err)
		}
	}
	if podLink.Attrs().MTU != n.cfg.MTU {
		if err := pod.LinkSetMTU(podLink, n.cfg.MTU); err != nil {
			return fmt.Errorf("set mtu of %s: %w", podIfName, err)
		}
	}
	if err := host.LinkSetUp(hostLink); err != nil {
		return fmt.Errorf("set veth %s up: %w", hostLink.Attrs().Name, err)
	}
	if err := pod.LinkSetUp(podLink); err != nil {
		return fmt.Errorf("set %s up: %w", podIfName, err)
	}
	addr := &netlink.Addr{IPNet: ipNet(ip, n.rng.prefix.Bits())}
	if err := setOnlyAddr(pod, podLink, addr); err != nil {
		return fmt.Errorf("%s: %w", podIfName, err)
	}
	route := &netlink.Route{
		LinkIndex: podLink.Attrs().Index,
		Dst:       &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
		Gw:        n.rng.gateway.AsSlice(),
		Scope:     netlink.SCOPE_UNIVERSE,
	}
	if err := pod.RouteReplace(route); err != nil {
		return fmt.Errorf("add default route via %s: %w", n.rng.gateway, err)
	}
	// The address may have been another pod's a moment ago: the host's
	// neighbour entry for it would still send the host's packets (probes,
	// hooks, the proxy's) to that pod's MAC, for up to a minute.
	n.forgetNeighbour(host, bridge.Attrs().Index, ip)
	return nil
}

// forgetNeighbour deletes the host's neighbour (ARP) entry for ip on the
// bridge, if it has one.
func (n *Network) forgetNeighbour(host *netlink.Handle, bridgeIndex int, ip netip.Addr) {
	err := host.NeighDel(&netlink.Neigh{LinkIndex: bridgeIndex, Family: netlink.FAMILY_V4, IP: ip.AsSlice()})
	if err != nil && !errors.Is(err, unix.ENOENT) {
		n.log.Debug("delete neighbour entry", "ip", ip, "err", err)
	}
}

// ensureVeth returns the pod's veth pair, creating it when it is missing
// and recreating it when only one end is left or the ends are not peers.
func (n *Network) ensureVeth(host, pod *netlink.Handle, podNS netns.NsHandle, uid string, bridge netlink.Link) (hostLink, podLink netlink.Link, err error) {
	hostName := hostVethName(uid)
	hostLink, herr := host.LinkByName(hostName)
	if herr != nil && !isNotFound(herr) {
		return nil, nil, fmt.Errorf("find veth %s: %w", hostName, herr)
	}
	podLink, perr := pod.LinkByName(podIfName)
	if perr != nil && !isNotFound(perr) {
		return nil, nil, fmt.Errorf("find %s: %w", podIfName, perr)
	}
	if herr == nil && perr == nil && peers(hostLink, podLink) {
		n.log.Debug("pod veth present", "uid", uid, "veth", hostName)
		return hostLink, podLink, nil
	}
	if herr == nil {
		if err := host.LinkDel(hostLink); err != nil && !errors.Is(err, unix.ENODEV) {
			return nil, nil, fmt.Errorf("delete stale veth %s: %w", hostName, err)
		}
	}
	if perr == nil {
		if err := pod.LinkDel(podLink); err != nil && !errors.Is(err, unix.ENODEV) {
			return nil, nil, fmt.Errorf("delete stale %s: %w", podIfName, err)
		}
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = hostName
	attrs.MTU = n.cfg.MTU
	attrs.MasterIndex = bridge.Attrs().Index
	veth := &netlink.Veth{
		LinkAttrs:     attrs,
		PeerName:      podIfName, // created straight in the pod netns
		PeerNamespace: netlink.NsFd(podNS),
	}
	if err := host.LinkAdd(veth); err != nil {
		return nil, nil, fmt.Errorf("create veth %s: %w", hostName, err)
	}
	if hostLink, err = host.LinkByName(hostName); err != nil {
		return nil, nil, fmt.Errorf("find new veth %s: %w", hostName, err)
	}
	if podLink, err = pod.LinkByName(podIfName); err != nil {
		return nil, nil, fmt.Errorf("find new %s: %w", podIfName, err)
	}
	n.log.Info("created pod veth", "uid", uid, "veth", hostName)
	return hostLink, podLink, nil
}

// peers reports whether a and b are the two ends of one veth pair. A
// veth's IFLA_LINK is its peer's ifindex (in the peer's netns).
func peers(a, b netlink.Link) bool {
	return a.Type() == "veth" && b.Type() == "veth" &&
		a.Attrs().ParentIndex == b.Attrs().Index && b.Attrs().ParentIndex == a.Attrs().Index
}

// Teardown deletes the pod's veth pair and netns (unmount, then remove
// the file) and releases its addresses. It is idempotent; the addresses
// are released last, so a failed Teardown leaves the pod listed by Pods
// for a later retry.
func (n *Network) Teardown(ctx context.Context, podUID string) error {
	if err := checkUID(podUID); err != nil {
		return fmt.Errorf("tear down pod network: %w", err)
	}
	defer n.pods.lock(podUID)()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pod %s: tear down network: %w", podUID, err)
	}
	host, err := n.hostHandle()
	if err != nil {
		return fmt.Errorf("pod %s: %w", podUID, err)
	}
	defer host.Close()
	name := hostVethName(podUID)
	link, err := host.LinkByName(name)
	switch {
	case isNotFound(err):
	case err != nil:
		return fmt.Errorf("pod %s: find veth %s: %w", podUID, name, err)
	default:
		if err := host.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("pod %s: delete veth %s: %w", podUID, name, err)
		}
	}
	if err := removeNetNS(n.NetNSPath(podUID)); err != nil {
		return fmt.Errorf("pod %s: %w", podUID, err)
	}
	n.ipamMu.Lock()
	freed, err := n.store.Release(podUID)
	n.ipamMu.Unlock()
	if err != nil {
		return fmt.Errorf("pod %s: release addresses: %w", podUID, err)
	}
	if len(freed) > 0 {
		n.log.Info("released pod network", "uid", podUID, "ip", strings.Join(freed, ","))
	}
	if bridge, err := host.LinkByName(n.cfg.BridgeName); err == nil {
		for _, a := range freed {
			if ip, err := netip.ParseAddr(a); err == nil {
				n.forgetNeighbour(host, bridge.Attrs().Index, ip)
			}
		}
	}
	return nil
}

// Pods returns, sorted, the UIDs of the pods that hold an address in
// IPAM, whether or not their netns still exists: the candidates for
// garbage collection by Teardown.
func (n *Network) Pods() ([]string, error) {
	allocs, err := n.store.Allocations()
	if err != nil {
		return nil, fmt.Errorf("list pod networks: %w", err)
	}
	var uids []string
	for _, owner := range allocs {
		uids = append(uids, owner)
	}
	slices.Sort(uids)
	return slices.Compact(uids), nil
}

// allocate returns uid's address, reserving the lowest free one when uid
// holds none in the pod CIDR.
func (n *Network) allocate(uid string) (netip.Addr, error) {
	n.ipamMu.Lock()
	defer n.ipamMu.Unlock()
	var lastErr error
	for range 3 {
		allocs, err := n.store.Allocations()
		if err != nil {
			return netip.Addr{}, fmt.Errorf("allocate address: %w", err)
		}
		c, err := n.rng.choose(allocs, uid)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("allocate address: %w", err)
		}
		if c.existing {
			return c.addr, nil
		}
		if len(c.stale) > 0 {
			if _, err := n.store.Release(uid); err != nil {
				return netip.Addr{}, fmt.Errorf("release addresses outside %s: %w", n.rng.prefix, err)
			}
		}
		// Reserve fails if someone else took the address in between;
		// look again.
		if lastErr = n.store.Reserve(c.addr.String(), uid); lastErr == nil {
			n.log.Info("allocated pod address", "uid", uid, "ip", c.addr.String())
			return c.addr, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("allocate address: %w", lastErr)
}

// ensureNetNS makes sure a network namespace is mounted at path.
func (n *Network) ensureNetNS(path string) error {
	if err := n.ensureNetnsDir(); err != nil {
		return err
	}
	ok, err := isNetNS(path)
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	if err := createNetNS(path); err != nil {
		return err
	}
	n.log.Info("created netns", "netns", path)
	return nil
}

// ensureNetnsDir creates NetnsDir and makes it a shared mount, once per
// Network (both steps are idempotent across restarts too).
func (n *Network) ensureNetnsDir() error {
	n.dirMu.Lock()
	defer n.dirMu.Unlock()
	if n.dirReady {
		return nil
	}
	if err := os.MkdirAll(n.cfg.NetnsDir, 0o755); err != nil {
		return fmt.Errorf("create netns dir: %w", err)
	}
	if err := makeSharedMount(n.cfg.NetnsDir); err != nil {
		return err
	}
	n.dirReady = true
	return nil
}

// hostNS returns the host netns handle, netns.None() for the current one.
func (n *Network) hostNS() netns.NsHandle {
	if n.cfg.HostNetNS <= 0 {
		return netns.None()
	}
	return n.cfg.HostNetNS
}

// hostIsCurrent reports whether the host netns is the process's own.
func (n *Network) hostIsCurrent() (bool, error) {
	ns := n.hostNS()
	if !ns.IsOpen() {
		return true, nil
	}
	cur, err := netns.Get()
	if err != nil {
		return false, fmt.Errorf("open current netns: %w", err)
	}
	defer cur.Close()
	return ns.Equal(cur), nil
}

// hostHandle opens a netlink handle in the host netns. Handles here are
// route netlink only (links, addresses, routes are all this package
// changes): by default the library also opens XFRM and NETFILTER
// sockets, which cost file descriptors and which a kernel without those
// protocols, or qemu-user, refuses with EPROTONOSUPPORT.
func (n *Network) hostHandle() (*netlink.Handle, error) {
	h, err := netlink.NewHandleAt(n.hostNS(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink in host netns: %w", err)
	}
	return h, nil
}

// setOnlyAddr gives link addr and removes every other IPv4 address.
func setOnlyAddr(h *netlink.Handle, link netlink.Link, addr *netlink.Addr) error {
	have, err := addrList(h, link)
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range have {
		if a.IPNet.String() == addr.IPNet.String() {
			continue
		}
		if err := h.AddrDel(link, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("delete address %s: %w", a.IPNet, err)
		}
	}
	if err := h.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("add address %s: %w", addr.IPNet, err)
	}
	return nil
}

// addrList lists link's IPv4 addresses, repeating a dump the kernel
// interrupted because the list changed under it.
func addrList(h *netlink.Handle, link netlink.Link) ([]netlink.Addr, error) {
	var (
		addrs []netlink.Addr
		err   error
	)
	for range 5 {
		addrs, err = h.AddrList(link, netlink.FAMILY_V4)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return addrs, err
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

// keyedMutex serializes work per key.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*refMutex
}

type refMutex struct {
	sync.Mutex
	refs int
}

// lock locks key and returns the function that unlocks it.
func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*refMutex{}
	}
	m := k.locks[key]
	if m == nil {
		m = &refMutex{}
		k.locks[key] = m
	}
	m.refs++
	k.mu.Unlock()
	m.Lock()
	return func() {
		m.Unlock()
		k.mu.Lock()
		if m.refs--; m.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}
