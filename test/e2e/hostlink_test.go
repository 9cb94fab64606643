package e2e

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/test/e2e/env"
)

// hostLinks counts the host links this test binary made: with its PID it
// picks the next subnet to try.
var hostLinks atomic.Uint32

// hostLinkPrefix holds every host link's subnet, a /30 each: 16384 of them.
var hostLinkPrefix = netip.MustParsePrefix("10.201.0.0/16")

// hostLink connects the node's network namespace to the host's with a veth
// pair on a /30 of 10.201.0.0/16 no host address is in: the host side,
// op<N> (N the /30's index), has the subnet's first address (hostSide),
// the node side, host0, the second. Both are up; the only route either
// gets is the connected one. It returns the node side's address, which
// the agent reports as the Node's InternalIP when it is the namespace's
// first address as the agent starts (call it before n.start), and at
// which processes in the host's namespace (kube-apiserver,
// metrics-server) reach the node. The host side is deleted in t's
// cleanup, and its peer with it.
func (n *node) hostLink() string {
	n.t.Helper()
	const subnets = 1 << (30 - 16)
	first := (os.Getpid()%256)*64 + int(hostLinks.Add(1)%64)
	for i := range 256 {
		idx := (first + i) % subnets
		base := hostLinkPrefix.Addr().As4()
		base[2], base[3] = byte(idx>>6), byte(idx&63)<<2
		subnet := netip.PrefixFrom(netip.AddrFrom4(base), 30)
		host, node := subnet.Addr().Next(), subnet.Addr().Next().Next()
		name := fmt.Sprintf("op%d", idx)
		if _, err := net.InterfaceByName(name); err == nil || hostAddrIn(n.t, subnet) {
			continue // another test's link, or someone else's address
		}
		out, err := exec.Command("ip", "link", "add", name, "type", "veth", "peer", "name", "host0", "netns", n.netns).CombinedOutput()
		if err != nil {
			if _, err := net.InterfaceByName(name); err == nil {
				continue // a test running beside this one took it first
			}
			n.t.Fatalf("ip link add %s: %v\n%s", name, err, out)
		}
		n.t.Cleanup(func() { exec.Command("ip", "link", "delete", name).Run() })
		run(n.t, "ip", "addr", "add", host.String()+"/30", "dev", name)
		run(n.t, "ip", "link", "set", name, "up")
		run(n.t, "ip", "netns", "exec", n.netns, "ip", "addr", "add", node.String()+"/30", "dev", "host0")
		run(n.t, "ip", "netns", "exec", n.netns, "ip", "link", "set", "host0", "up")
		return node.String()
	}
	n.t.Fatalf("no free /30 in %s for a host link", hostLinkPrefix)
	return ""
}

// hostSide returns the host side's address of the host link whose node
// side is nodeIP.
func hostSide(nodeIP string) string {
	return netip.MustParseAddr(nodeIP).Prev().String()
}

// hostAddrIn reports whether an address of the host's namespace is in p.
func hostAddrIn(t testing.TB, p netip.Prefix) bool {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok && p.Contains(ip.Unmap()) {
				return true
			}
		}
	}
	return false
}

// TestMetricsServerRegisters: metrics-server, run on the host side of a
// node's host link, is served by kube-apiserver through the aggregation
// layer, and the node is reachable from the host's namespace at the
// address the agent reports.
func TestMetricsServerRegisters(t *testing.T) {
	env.RequireRoot(t)
	api := env.StartAPIServer(t)
	adm := newAdmin(t, api)
	n := newNode(t, "e2e-hostlink")
	n.connect(api)
	nodeIP := n.hostLink()
	n.start()

	within(60*time.Second).For(t, "the node's InternalIP "+nodeIP, func() (bool, string) {
		ctx, cancel := adm.ctx()
		defer cancel()
		var node corev1.Node
		if err := adm.core.Get().Resource("nodes").Name(n.name).Do(ctx).Into(&node); err != nil {
			return false, err.Error()
		}
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				return a.Address == nodeIP, asJSON(node.Status.Addresses)
			}
		}
		return false, asJSON(node.Status.Addresses)
	})

	// Routing from the host's namespace: a refused connection is the
	// node's kernel answering on the link.
	c, err := net.DialTimeout("tcp", net.JoinHostPort(nodeIP, "1"), 5*time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("%s:1 accepted a connection; want it refused", nodeIP)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s:1 from the host: %v; want connection refused", nodeIP, err)
	}

	ms := env.StartMetricsServer(t, api, hostSide(nodeIP))
	t.Logf("metrics-server on %s", ms.Addr)
	// kubectl get --raw fails on any status but 2xx.
	out := api.Kubectl(t, "get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes")
	if !strings.Contains(out, `"kind":"NodeMetricsList"`) {
		t.Fatalf("GET /apis/metrics.k8s.io/v1beta1/nodes: want a NodeMetricsList, got:\n%s", out)
	}
	t.Logf("GET /apis/metrics.k8s.io/v1beta1/nodes: %s", strings.TrimSpace(out))
}
