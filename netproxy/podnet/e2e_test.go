package podnet

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/outpost-edge/outpost/netproxy/nft"
	"github.com/outpost-edge/outpost/store"
)

// The end-to-end tests run against the real kernel, in network namespaces
// they create: "host" plays the node (bridge, host veths, nftables) and
// "world" a machine on the node's uplink. The test process's own netns is
// never changed.

const (
	uidA = "aaaaaaaa-0000-4000-8000-000000000001"
	uidB = "bbbbbbbb-0000-4000-8000-000000000002"
	uidC = "cccccccc-0000-4000-8000-000000000003"

	worldIP = "192.0.2.1" // world's end of the uplink
	hostIP  = "192.0.2.2" // host's end of the uplink
)

const dialTimeout = 5 * time.Second

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, links and nftables rules")
	}
}

// newNS creates an anonymous network namespace, held by the returned
// handle until the test ends, with loopback up.
func newNS(t testing.TB) netns.NsHandle {
	t.Helper()
	ns := netns.None()
	err := onFreshThread(func() (bool, error) {
		orig, err := netns.Get()
		if err != nil {
			return true, err
		}
		defer orig.Close()
		if ns, err = netns.New(); err != nil {
			return false, err // unshare may have happened: let the thread die
		}
		if err := netns.Set(orig); err != nil {
			return false, err
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	h := handleAt(t, ns)
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("set lo up: %v", err)
	}
	return ns
}

func handleAt(t testing.TB, ns netns.NsHandle) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatalf("netlink handle: %v", err)
	}
	t.Cleanup(h.Close)
	return h
}

// env is one test's node: a host netns, a store and a Network.
type env struct {
	host      netns.NsHandle
	storePath string
	store     *store.Store
	cfg       Config
	net       *Network
	log       *slog.Logger
}

func newEnv(t testing.TB, cidr string) *env {
	t.Helper()
	requireRoot(t)
	e := &env{host: newNS(t)}
	dir := t.TempDir()
	nsDir := filepath.Join(dir, "netns")
	// Runs after every pod is torn down: peel off the shared self-bind
	// mount Setup puts on NetnsDir (and anything left under it) so the
	// temp dir can be removed.
	t.Cleanup(func() {
		for range maxStackedMounts {
			if err := unix.Unmount(nsDir, unix.MNT_DETACH); err != nil {
				return
			}
		}
	})
	e.storePath = filepath.Join(dir, store.FileName)
	e.openStore(t)
	t.Cleanup(func() { e.store.Close() }) // whichever store is open by then
	sum := sha256.Sum256([]byte(t.Name()))
	e.cfg = Config{
		PodCIDR:     netip.MustParsePrefix(cidr),
		NetnsDir:    nsDir,
		NetnsPrefix: "t" + hex.EncodeToString(sum[:])[:6] + "-",
		HostNetNS:   e.host,
	}
	e.log = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.newNetwork(t)
	if err := e.net.EnsureBridge(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Registered last, so it runs first: every pod still in IPAM is torn
	// down, whatever path the test left by.
	t.Cleanup(func() {
		pods, err := e.net.Pods()
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		for _, uid := range pods {
			// t.Context is already canceled when cleanups run.
			if err := e.net.Teardown(context.Background(), uid); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	return e
}

func (e *env) openStore(t testing.TB) {
	t.Helper()
	st, err := store.Open(e.storePath, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e.store = st
}

func (e *env) newNetwork(t testing.TB) {
	t.Helper()
	n, err := New(e.cfg, Deps{Store: e.store, Log: e.log})
	if err != nil {
		t.Fatal(err)
	}
	e.net = n
}

// restart simulates an agent restart: the store file is closed and opened
// again and a new Network is built over it.
func (e *env) restart(t *testing.T) {
	t.Helper()
	if err := e.store.Close(); err != nil {
		t.Fatal(err)
	}
	e.openStore(t)
	e.newNetwork(t)
}

func (e *env) setup(t *testing.T, uid string) Result {
	t.Helper()
	r, err := e.net.Setup(t.Context(), uid)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// addWorld connects a new "world" netns to host with a veth:
// world 192.0.2.1/24, host 192.0.2.2/24. World has no route to the pod
// CIDR, so pod traffic reaches it only if it is masqueraded.
func (e *env) addWorld(t *testing.T) netns.NsHandle {
	t.Helper()
	world := newNS(t)
	h, w := handleAt(t, e.host), handleAt(t, world)
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "uplink"
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "eth0", PeerNamespace: netlink.NsFd(world)}); err != nil {
		t.Fatalf("create uplink veth: %v", err)
	}
	for _, side := range []struct {
		h    *netlink.Handle
		name string
		addr string
	}{{h, "uplink", hostIP + "/24"}, {w, "eth0", worldIP + "/24"}} {
		l, err := side.h.LinkByName(side.name)
		if err != nil {
			t.Fatal(err)
		}
		addr, _ := netlink.ParseAddr(side.addr)
		if err := side.h.AddrAdd(l, addr); err != nil {
			t.Fatal(err)
		}
		if err := side.h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	return world
}

// nsAt opens the netns mounted at path for the rest of the test.
func nsAt(t *testing.T, path string) netns.NsHandle {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// listen opens a TCP listener inside ns; the socket stays there after
// the thread switches back.
func listen(t *testing.T, ns netns.NsHandle, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	err := inNetNS(ns, func() (err error) {
		l, err = net.Listen("tcp4", addr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// serveOnce accepts one connection on l and writes the peer's address
// (as the server sees it) to it.
func serveOnce(l net.Listener) {
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprintln(c, c.RemoteAddr())
	}()
}

// dialSource connects from inside ns to addr and returns the source
// address the server reports.
func dialSource(ns netns.NsHandle, addr string, timeout time.Duration) (netip.AddrPort, error) {
	var c net.Conn
	err := inNetNS(ns, func() (err error) {
		d := net.Dialer{Timeout: timeout}
		c, err = d.Dial("tcp4", addr)
		return err
	})
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return netip.AddrPort{}, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("read from %s: %w", addr, err)
	}
	return netip.ParseAddrPort(strings.TrimSpace(line))
}

// wantSource dials and fails the test unless the server saw src.
func wantSource(t *testing.T, what string, ns netns.NsHandle, l net.Listener, addr string, src netip.Addr) {
	t.Helper()
	serveOnce(l)
	got, err := dialSource(ns, addr, dialTimeout)
	if err != nil {
		t.Fatalf("%s: connect to %s: %v", what, addr, err)
	}
	if got.Addr() != src {
		t.Errorf("%s: server saw source %s, want %s", what, got.Addr(), src)
	}
}

func readIPForward(t *testing.T, ns netns.NsHandle) string {
	t.Helper()
	var b []byte
	err := inNetNS(ns, func() (err error) {
		b, err = os.ReadFile(ipForwardPath)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestE2ETwoPodsConnect: two pods get distinct addresses in the pod CIDR,
// their netns are mounted, and pod A opens a TCP connection to a listener
// in pod B over the bridge, unNATed. Forwarding is on in the host netns,
// and nothing appeared in the test process's own netns.
func TestE2ETwoPodsConnect(t *testing.T) {
	e := newEnv(t, "10.42.0.0/24")
	a, b := e.setup(t, uidA), e.setup(t, uidB)
	if a.IP == b.IP {
		t.Fatalf("pods share address %s", a.IP)
	}
	gw := netip.MustParseAddr("10.42.0.1")
	for _, r := range []Result{a, b} {
		if !r.Prefix.Contains(r.IP) || r.IP == gw || r.Gateway != gw || r.Prefix.String() != "10.42.0.0/24" {
			t.Errorf("result %+v: want an address in 10.42.0.0/24 other than the gateway 10.42.0.1", r)
		}
		if ok, err := isNetNS(r.NetNSPath); !ok || err != nil {
			t.Errorf("%s is not a mounted netns (%v)", r.NetNSPath, err)
		}
	}
	if got := readIPForward(t, e.host); got != "1" {
		t.Errorf("host ip_forward = %s, want 1", got)
	}
	for _, name := range []string{hostVethName(uidA), hostVethName(uidB)} {
		if _, err := netlink.LinkByName(name); !isNotFound(err) {
			t.Errorf("veth %s visible in the test process's netns (err %v)", name, err)
		}
	}
	// Idempotent EnsureBridge.
	if err := e.net.EnsureBridge(t.Context()); err != nil {
		t.Fatal(err)
	}

	l := listen(t, nsAt(t, b.NetNSPath), netip.AddrPortFrom(b.IP, 8080).String())
	wantSource(t, "pod A to pod B", nsAt(t, a.NetNSPath), l, netip.AddrPortFrom(b.IP, 8080).String(), a.IP)
}

// TestE2ERestartAndTeardown: after an agent restart (store reopened, new
// Network), Setup finds the existing netns and veths and returns the same
// addresses, even when pods are set up in the other order; a pod whose
// host veth vanished is repaired. Teardown releases the address, removes
// the netns file and the host veth, and is idempotent; the freed address
// is the next one handed out.
func TestE2ERestartAndTeardown(t *testing.T) {
	e := newEnv(t, "10.42.0.0/24")
	a1, b1 := e.setup(t, uidA), e.setup(t, uidB)
	host := handleAt(t, e.host)
	vethA, err := host.LinkByName(hostVethName(uidA))
	if err != nil {
		t.Fatal(err)
	}

	e.restart(t)
	b2, a2 := e.setup(t, uidB), e.setup(t, uidA) // reverse order
	if a2 != a1 || b2 != b1 {
		t.Fatalf("after restart: A %+v, B %+v; want A %+v, B %+v", a2, b2, a1, b1)
	}
	vethA2, err := host.LinkByName(hostVethName(uidA))
	if err != nil {
		t.Fatal(err)
	}
	if vethA2.Attrs().Index != vethA.Attrs().Index {
		t.Errorf("veth of A recreated on restart (index %d -> %d), want it found", vethA.Attrs().Index, vethA2.Attrs().Index)
	}
	pods, err := e.net.Pods()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(pods, []string{uidA, uidB}) {
		t.Errorf("Pods = %v, want [%s %s]", pods, uidA, uidB)
	}

	// Repair: B's host veth (and with it B's eth0) disappears.
	vethB, err := host.LinkByName(hostVethName(uidB))
	if err != nil {
		t.Fatal(err)
	}
	if err := host.LinkDel(vethB); err != nil {
		t.Fatal(err)
	}
	if b3 := e.setup(t, uidB); b3 != b1 {
		t.Errorf("repaired B = %+v, want %+v", b3, b1)
	}
	l := listen(t, nsAt(t, b1.NetNSPath), netip.AddrPortFrom(b1.IP, 8080).String())
	wantSource(t, "pod A to repaired pod B", nsAt(t, a1.NetNSPath), l, netip.AddrPortFrom(b1.IP, 8080).String(), a1.IP)

	for range 2 { // the second Teardown finds nothing to do
		if err := e.net.Teardown(t.Context(), uidA); err != nil {
			t.Fatal(err)
		}
	}
	allocs, err := e.store.Allocations()
	if err != nil {
		t.Fatal(err)
	}
	if owner, ok := allocs[a1.IP.String()]; ok {
		t.Errorf("address %s still allocated to %s after Teardown", a1.IP, owner)
	}
	if _, err := os.Stat(a1.NetNSPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns file %s after Teardown: %v", a1.NetNSPath, err)
	}
	if _, err := host.LinkByName(hostVethName(uidA)); !isNotFound(err) {
		t.Errorf("host veth %s after Teardown: err %v", hostVethName(uidA), err)
	}
	if pods, _ := e.net.Pods(); !slices.Equal(pods, []string{uidB}) {
		t.Errorf("Pods after Teardown = %v, want [%s]", pods, uidB)
	}
	if c := e.setup(t, uidC); c.IP != a1.IP {
		t.Errorf("pod C got %s, want the freed %s", c.IP, a1.IP)
	}
}

// requireNFNetlink skips the test when no NETLINK_NETFILTER socket can be
// made, so nftables cannot be programmed: qemu-user (make test-arm) passes
// only route, uevent and audit netlink through to the kernel.
func requireNFNetlink(t *testing.T) {
	t.Helper()
	err := nft.Available()
	if errors.Is(err, unix.EPROTONOSUPPORT) {
		t.Skip("no NETLINK_NETFILTER socket (EPROTONOSUPPORT), so no nftables: qemu-user does not emulate it")
	}
	if err != nil {
		t.Fatal(err)
	}
}

// newNAT returns a function that makes the host netns's outpost table
// hold the pod CIDR's egress masquerade and hostPorts (and no Services),
// through the Table the service proxy uses; the table is deleted when the
// test ends.
func newNAT(t *testing.T, e *env) func(hostPorts []nft.HostPort) error {
	t.Helper()
	requireNFNetlink(t)
	rs := nft.NewNetlink(int(e.host))
	tb := nft.NewTable(rs)
	t.Cleanup(func() {
		tx := &nft.Tx{}
		tx.DelTable()
		if err := rs.Apply(tx); err != nil {
			t.Errorf("delete nat table: %v", err)
		}
	})
	return func(hostPorts []nft.HostPort) error {
		_, err := tb.Sync(nft.State{PodCIDR: e.cfg.PodCIDR, HostPorts: hostPorts})
		return err
	}
}

// TestE2EMasquerade: a pod reaches a listener in "world", which has no
// route back to the pod CIDR, only once the NAT is synced, and world sees
// the host's uplink address as the source.
func TestE2EMasquerade(t *testing.T) {
	e := newEnv(t, "10.42.0.0/24")
	world := e.addWorld(t)
	a := e.setup(t, uidA)
	podA := nsAt(t, a.NetNSPath)
	l := listen(t, world, worldIP+":9000")

	// Control: without masquerade the reply has no route; the dial times out.
	if src, err := dialSource(podA, worldIP+":9000", time.Second); err == nil {
		t.Fatalf("connected to world without NAT (world saw %s); the test proves nothing", src)
	}

	syncNAT := newNAT(t, e)
	if err := syncNAT(nil); err != nil {
		t.Fatal(err)
	}
	wantSource(t, "pod A to world", podA, l, worldIP+":9000", netip.MustParseAddr(hostIP))
}

// TestE2EHostPort: with a hostPort 30080 -> pod A:8080, world reaches the
// pod through the host's uplink address and keeps its source address; the
// host itself (output chain) reaches it; pod A reaching its own hostPort
// (hairpin) and pod B reaching it through the gateway address are
// masqueraded to the gateway. A hostPort bound to one host IP is not
// reachable through another, and a Sync without the hostPort removes it.
func TestE2EHostPort(t *testing.T) {
	e := newEnv(t, "10.42.0.0/24")
	world := e.addWorld(t)
	a, b := e.setup(t, uidA), e.setup(t, uidB)
	podA, podB := nsAt(t, a.NetNSPath), nsAt(t, b.NetNSPath)
	l := listen(t, podA, "0.0.0.0:8080")
	gw, host, wld := a.Gateway, netip.MustParseAddr(hostIP), netip.MustParseAddr(worldIP)

	syncNAT := newNAT(t, e)
	ports := []nft.HostPort{
		{Protocol: "TCP", HostPort: 30080, PodIP: a.IP, ContainerPort: 8080},
		{Protocol: "TCP", HostIP: host, HostPort: 30081, PodIP: a.IP, ContainerPort: 8080},
	}
	for range 2 { // a second Sync changes nothing
		if err := syncNAT(ports); err != nil {
			t.Fatal(err)
		}
	}

	wantSource(t, "world to hostPort", world, l, hostIP+":30080", wld)
	wantSource(t, "host to hostPort", e.host, l, hostIP+":30080", host)
	wantSource(t, "pod A to its own hostPort", podA, l, hostIP+":30080", gw)
	wantSource(t, "pod B to hostPort on gateway", podB, l, gw.String()+":30080", gw)
	wantSource(t, "world to hostPort on host IP", world, l, hostIP+":30081", wld)

	// 30081 is bound to 192.0.2.2 only: through the gateway address the
	// host answers itself, and nothing listens there.
	if _, err := dialSource(podB, gw.String()+":30081", dialTimeout); !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("pod B to 30081 on the gateway: err %v, want connection refused", err)
	}

	if err := syncNAT(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := dialSource(world, hostIP+":30080", dialTimeout); !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("world to removed hostPort: err %v, want connection refused", err)
	}
}

// TestE2EConcurrentSetup: pods set up at the same time get distinct
// addresses, the lowest ones in the range.
func TestE2EConcurrentSetup(t *testing.T) {
	e := newEnv(t, "10.42.0.0/24")
	const pods = 8
	results := make(chan Result, pods)
	errs := make(chan error, pods)
	for i := range pods {
		go func() {
			r, err := e.net.Setup(t.Context(), fmt.Sprintf("%08d-0000-4000-8000-000000000000", i))
			if err != nil {
				errs <- err
				return
			}
			results <- r
		}()
	}
	seen := map[netip.Addr]bool{}
	for range pods {
		select {
		case err := <-errs:
			t.Fatal(err)
		case r := <-results:
			if seen[r.IP] {
				t.Errorf("address %s handed out twice", r.IP)
			}
			seen[r.IP] = true
		}
	}
	for i := range pods {
		if a := netip.AddrFrom4([4]byte{10, 42, 0, byte(2 + i)}); !seen[a] {
			t.Errorf("address %s not handed out; got %v", a, seen)
		}
	}
}

// TestE2EEnsureBridgeRepairs: EnsureBridge brings a bridge that was set
// down and given a stray address back to up with only the gateway address,
// and keeps its MAC address.
func TestE2EEnsureBridgeRepairs(t *testing.T) {
	e := newEnv(t, "10.42.0.0/24")
	h := handleAt(t, e.host)
	br, err := h.LinkByName(e.net.cfg.BridgeName)
	if err != nil {
		t.Fatal(err)
	}
	mac := br.Attrs().HardwareAddr.String()
	if mac != bridgeMAC(e.net.cfg.BridgeName).String() {
		t.Errorf("bridge MAC %s, want %s", mac, bridgeMAC(e.net.cfg.BridgeName))
	}
	stray, _ := netlink.ParseAddr("10.99.0.1/16")
	if err := h.AddrAdd(br, stray); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetDown(br); err != nil {
		t.Fatal(err)
	}
	e.setup(t, uidA) // a port with its own MAC does not move the bridge's
	if err := e.net.EnsureBridge(t.Context()); err != nil {
		t.Fatal(err)
	}
	br, err = h.LinkByName(e.net.cfg.BridgeName)
	if err != nil {
		t.Fatal(err)
	}
	if br.Attrs().Flags&net.FlagUp == 0 {
		t.Error("bridge is down after EnsureBridge")
	}
	if got := br.Attrs().HardwareAddr.String(); got != mac {
		t.Errorf("bridge MAC changed from %s to %s", mac, got)
	}
	addrs, err := h.AddrList(br, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[0].IPNet.String() != "10.42.0.1/24" {
		t.Errorf("bridge addresses = %v, want only 10.42.0.1/24", addrs)
	}
}

// TestE2EReusedAddressReachesTheNewPod: a pod that gets the address of a
// pod just torn down is reachable from the host at once. The host's
// neighbour entry for the address named the old pod's MAC, and would have
// sent the host's packets (probes, hooks) there for up to a minute.
func TestE2EReusedAddressReachesTheNewPod(t *testing.T) {
	e := newEnv(t, "10.42.0.0/24")
	requireNeighDel(t, e)
	gw := netip.MustParseAddr("10.42.0.1")
	a := e.setup(t, uidA)
	e.setup(t, uidC) // keeps the bridge up, and its neighbour table with it
	addr := netip.AddrPortFrom(a.IP, 8080).String()
	la := listen(t, nsAt(t, a.NetNSPath), addr)
	wantSource(t, "host to pod A", e.host, la, addr, gw) // the host learns A's MAC
	la.Close()
	if err := e.net.Teardown(t.Context(), uidA); err != nil {
		t.Fatal(err)
	}
	b := e.setup(t, uidB)
	if b.IP != a.IP {
		t.Fatalf("pod B got %s, want A's freed %s", b.IP, a.IP)
	}
	lb := listen(t, nsAt(t, b.NetNSPath), addr)
	serveOnce(lb)
	if _, err := dialSource(e.host, addr, 2*time.Second); err != nil {
		t.Fatalf("host to pod B at A's old address: %v", err)
	}
}

// requireNeighDel skips the test where neighbour entries cannot be
// deleted: qemu-user (make test-arm) answers RTM_DELNEIGH with
// EOPNOTSUPP, which no kernel a board runs does.
func requireNeighDel(t *testing.T, e *env) {
	t.Helper()
	h := handleAt(t, e.host)
	br, err := h.LinkByName(e.net.cfg.BridgeName)
	if err != nil {
		t.Fatal(err)
	}
	err = h.NeighDel(&netlink.Neigh{LinkIndex: br.Attrs().Index, Family: netlink.FAMILY_V4, IP: net.IPv4(10, 42, 0, 254)})
	if errors.Is(err, unix.EOPNOTSUPP) {
		t.Skip("neighbour entries cannot be deleted here (EOPNOTSUPP): qemu-user does not translate RTM_DELNEIGH")
	}
}
