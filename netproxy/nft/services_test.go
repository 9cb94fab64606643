package nft_test

import (
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/netproxy/servicemodel"

	"github.com/outpost-edge/outpost/netproxy/nft"
	"github.com/outpost-edge/outpost/netproxy/nfttest"
)

// The node of these tests: pod CIDR 10.42.0.0/24, addresses 192.0.2.10
// and 2001:db8::10; 10.42.1.0/24 is another node's pods.
var (
	tsPodCIDR = netip.MustParsePrefix("10.42.0.0/24")
	tsNode    = netip.MustParseAddr("192.0.2.10")
	tsNode2   = netip.MustParseAddr("192.0.2.11") // also the node's
	tsNode6   = netip.MustParseAddr("2001:db8::10")
	tsClient  = netip.MustParseAddr("198.51.100.1") // outside the cluster
	tsPod     = netip.MustParseAddr("10.42.0.3")    // a client pod on this node
	tsPod6    = netip.MustParseAddr("fd00:42::3")
	tsLocalEP = netip.MustParseAddr("10.42.0.5") // endpoints on this node
	tsLocal2  = netip.MustParseAddr("10.42.0.6")
	tsLocal6  = netip.MustParseAddr("fd00:42::5")
	tsHPPod   = netip.MustParseAddr("10.42.0.7") // pods with hostPorts
	tsHPPod2  = netip.MustParseAddr("10.42.0.8")
	tsRemote  = netip.MustParseAddr("10.42.1.7") // endpoints on another node
	tsRemote2 = netip.MustParseAddr("10.42.1.9")
)

func tsIsLocal(a netip.Addr) bool {
	switch a {
	case tsNode, tsNode2, tsNode6, netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback():
		return true
	}
	return false
}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func ready(a netip.Addr, port uint16, local bool) servicemodel.Endpoint {
	return servicemodel.Endpoint{Addr: a, Port: port, Ready: true, Serving: true, Local: local}
}

// The representative services, one per feature.
func svcClusterIP() servicemodel.ServicePort {
	return servicemodel.ServicePort{
		Namespace: "default", Name: "web", PortName: "http", Protocol: "TCP",
		ClusterIPs: []netip.Addr{ip("10.96.0.10")}, Port: 80,
		Endpoints: []servicemodel.Endpoint{
			ready(tsLocalEP, 8080, true),
			ready(tsRemote, 8080, false),
			{Addr: tsRemote2, Port: 8080, Serving: false}, // not ready: no traffic
		},
	}
}

func svcUDP() servicemodel.ServicePort {
	return servicemodel.ServicePort{
		Namespace: "kube-system", Name: "dns", Protocol: "UDP",
		ClusterIPs: []netip.Addr{ip("10.96.0.53")}, Port: 53,
		Endpoints: []servicemodel.Endpoint{ready(tsLocal2, 53, true)},
	}
}

func svcSCTP() servicemodel.ServicePort {
	return servicemodel.ServicePort{
		Namespace: "default", Name: "diameter", Protocol: "SCTP",
		ClusterIPs: []netip.Addr{ip("10.96.0.20")}, Port: 3868,
		Endpoints: []servicemodel.Endpoint{ready(tsRemote, 3868, false)},
	}
}

func svcNodePort() servicemodel.ServicePort {
	return servicemodel.ServicePort{
		Namespace: "default", Name: "np", Protocol: "TCP",
		ClusterIPs: []netip.Addr{ip("10.96.0.30")}, Port: 80, NodePort: 30080,
		Endpoints: []servicemodel.Endpoint{ready(tsLocalEP, 8080, true), ready(tsRemote, 8080, false)},
	}
}

func svcExternalIP() servicemodel.ServicePort {
	return servicemodel.ServicePort{
		Namespace: "default", Name: "ext", Protocol: "TCP",
		ClusterIPs: []netip.Addr{ip("10.96.0.31")}, Port: 80,
		ExternalIPs: []netip.Addr{ip("198.51.100.7")},
		Endpoints:   []servicemodel.Endpoint{ready(tsRemote, 8080, false)},
	}
}

func svcLoadBalancer() servicemodel.ServicePort {
	return servicemodel.ServicePort{
		Namespace: "default", Name: "lb", Protocol: "TCP",
		ClusterIPs: []netip.Addr{ip("10.96.0.32")}, Port: 443, NodePort: 30443,
		LoadBalancerIPs: []netip.Addr{ip("203.0.113.5")},
		Endpoints:       []servicemodel.Endpoint{ready(tsLocalEP, 8443, true)},
	}
}

func svcAffinity() servicemodel.ServicePort {
	return servicemodel.ServicePort{
		Namespace: "default", Name: "sticky", Protocol: "TCP",
		ClusterIPs: []netip.Addr{ip("10.96.0.40")}, Port: 80, AffinityTimeout: 3 * time.Hour,
		Endpoints: []servicemodel.Endpoint{ready(tsLocalEP, 8080, true), ready(tsRemote, 8080, false)},
	}
}

func svcInternalLocal() servicemodel.ServicePort {
	return servicemodel.ServicePort{
		Namespace: "default", Name: "itp", Protocol: "TCP",
		ClusterIPs: []netip.Addr{ip("10.96.0.50")}, Port: 80, InternalLocal: true,
		Endpoints: []servicemodel.Endpoint{ready(tsLocalEP, 8080, true), ready(tsRemote, 8080, false)},
	}
}

func svcExternalLocal() servicemodel.ServicePort {
	return servicemodel.ServicePort{
		Namespace: "default", Name: "etp", Protocol: "TCP",
		ClusterIPs: []netip.Addr{ip("10.96.0.60")}, Port: 80, NodePort: 30060, ExternalLocal: true,
		LoadBalancerIPs: []netip.Addr{ip("203.0.113.6")},
		Endpoints:       []servicemodel.Endpoint{ready(tsLocalEP, 8080, true), ready(tsRemote, 8080, false)},
	}
}

func svcExternalLocalNone() servicemodel.ServicePort {
	return servicemodel.ServicePort{
		Namespace: "default", Name: "etp-remote", Protocol: "TCP",
		ClusterIPs: []netip.Addr{ip("10.96.0.61")}, Port: 80, NodePort: 30061, ExternalLocal: true,
		LoadBalancerIPs: []netip.Addr{ip("203.0.113.7")},
		Endpoints:       []servicemodel.Endpoint{ready(tsRemote, 8080, false)},
	}
}

func svcNoEndpoints() servicemodel.ServicePort {
	return servicemodel.ServicePort{
		Namespace: "default", Name: "empty", Protocol: "TCP",
		ClusterIPs: []netip.Addr{ip("10.96.0.70")}, Port: 80, NodePort: 30070,
		ExternalIPs: []netip.Addr{ip("198.51.100.8")},
	}
}

// svcNodePortNoEndpoints has no chain: a NodePort alone, and nowhere to
// send its traffic.
func svcNodePortNoEndpoints() servicemodel.ServicePort {
	return servicemodel.ServicePort{
		Namespace: "default", Name: "empty-np", Protocol: "TCP",
		ClusterIPs: []netip.Addr{ip("10.96.0.71")}, Port: 80, NodePort: 30071,
	}
}

func svcTerminating() servicemodel.ServicePort {
	return servicemodel.ServicePort{
		Namespace: "default", Name: "draining", Protocol: "TCP",
		ClusterIPs: []netip.Addr{ip("10.96.0.80")}, Port: 80,
		Endpoints: []servicemodel.Endpoint{
			{Addr: tsLocalEP, Port: 8080, Serving: true, Terminating: true, Local: true},
			{Addr: tsRemote, Port: 8080, Terminating: true}, // not serving: no traffic
		},
	}
}

func svcDualStack() servicemodel.ServicePort {
	return servicemodel.ServicePort{
		Namespace: "default", Name: "dual", Protocol: "TCP",
		ClusterIPs: []netip.Addr{ip("10.96.0.90"), ip("fd00:96::90")}, Port: 80, NodePort: 30090,
		Endpoints: []servicemodel.Endpoint{ready(tsLocalEP, 8080, true), ready(tsLocal6, 8080, true)},
	}
}

func tsHostPorts() []nft.HostPort {
	return []nft.HostPort{
		{Protocol: "TCP", HostPort: 8443, PodIP: tsHPPod, ContainerPort: 8080},
		{Protocol: "UDP", HostIP: tsNode, HostPort: 5353, PodIP: tsHPPod2, ContainerPort: 53},
		{Protocol: "SCTP", HostPort: 3868, PodIP: tsHPPod2, ContainerPort: 3868},
	}
}

// tsState is the representative State: every feature at once.
func tsState() nft.State {
	return nft.State{
		PodCIDR:   tsPodCIDR,
		HostPorts: tsHostPorts(),
		Services: []servicemodel.ServicePort{
			svcClusterIP(), svcUDP(), svcSCTP(), svcNodePort(), svcExternalIP(), svcLoadBalancer(),
			svcAffinity(), svcInternalLocal(), svcExternalLocal(), svcExternalLocalNone(),
			svcNoEndpoints(), svcNodePortNoEndpoints(), svcTerminating(), svcDualStack(),
		},
	}
}

// synced returns a Fake holding s, synced by a new Table.
func synced(t testing.TB, s nft.State) (*nfttest.Fake, *nft.Table) {
	t.Helper()
	f := nfttest.NewFake()
	tb := nft.NewTable(f)
	if _, err := tb.Sync(s); err != nil {
		t.Fatal(err)
	}
	return f, tb
}

// TestTableGolden: the table for each feature alone, and for all of them,
// is the one in testdata/services/<name>.golden (-update rewrites them).
func TestTableGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    nft.State
	}{
		{"empty", nft.State{PodCIDR: tsPodCIDR}},
		{"clusterip", nft.State{PodCIDR: tsPodCIDR, Services: []servicemodel.ServicePort{svcClusterIP()}}},
		{"udp", nft.State{PodCIDR: tsPodCIDR, Services: []servicemodel.ServicePort{svcUDP()}}},
		{"sctp", nft.State{PodCIDR: tsPodCIDR, Services: []servicemodel.ServicePort{svcSCTP()}}},
		{"nodeport", nft.State{PodCIDR: tsPodCIDR, Services: []servicemodel.ServicePort{svcNodePort()}}},
		{"externalip", nft.State{PodCIDR: tsPodCIDR, Services: []servicemodel.ServicePort{svcExternalIP()}}},
		{"loadbalancer", nft.State{PodCIDR: tsPodCIDR, Services: []servicemodel.ServicePort{svcLoadBalancer()}}},
		{"affinity", nft.State{PodCIDR: tsPodCIDR, Services: []servicemodel.ServicePort{svcAffinity()}}},
		{"internal-local", nft.State{PodCIDR: tsPodCIDR, Services: []servicemodel.ServicePort{svcInternalLocal()}}},
		{"external-local", nft.State{PodCIDR: tsPodCIDR, Services: []servicemodel.ServicePort{svcExternalLocal(), svcExternalLocalNone()}}},
		{"no-endpoints", nft.State{PodCIDR: tsPodCIDR, Services: []servicemodel.ServicePort{svcNoEndpoints()}}},
		{"terminating", nft.State{PodCIDR: tsPodCIDR, Services: []servicemodel.ServicePort{svcTerminating()}}},
		{"dual-stack", nft.State{PodCIDR: tsPodCIDR, Services: []servicemodel.ServicePort{svcDualStack()}}},
		{"hostports", nft.State{PodCIDR: tsPodCIDR, HostPorts: tsHostPorts()}},
		{"all", tsState()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, _ := synced(t, tc.s)
			checkGolden(t, filepath.Join("testdata", "services", tc.name+".golden"), f.Dump())
		})
	}
}

func checkGolden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("table differs from %s:\n%s", path, nfttest.LineDiff(string(want), got))
	}
}

// traceOutcomes returns the outcomes of p, sorted.
func traceOutcomes(t *testing.T, f *nfttest.Fake, p nfttest.Packet) []string {
	t.Helper()
	outs, err := f.Trace(p, tsIsLocal)
	if err != nil {
		t.Fatal(err)
	}
	s := make([]string, len(outs))
	for i, o := range outs {
		s[i] = o.String()
	}
	slices.Sort(s)
	return s
}

// affinitySetOf returns the name of the affinity set of sp's endpoint e.
func affinitySetOf(sp servicemodel.ServicePort, e netip.Addr, port uint16) string {
	return nft.PrefixAffinity + nft.HashName(nft.EndpointReadable(sp.String(), servicemodel.Endpoint{Addr: e, Port: port}))
}

// TestTableTrace pushes packets through the representative table and
// checks where they go: which endpoints, masqueraded or not, dropped or
// rejected.
func TestTableTrace(t *testing.T) {
	f, _ := synced(t, tsState())
	tcp := func(src, dst netip.Addr, port uint16) nfttest.Packet {
		return nfttest.Packet{Src: src, Dst: dst, Protocol: "TCP", Port: port}
	}
	out := func(p nfttest.Packet) nfttest.Packet { p.Output = true; return p }
	sticky := affinitySetOf(svcAffinity(), tsRemote, 8080)
	stickyLocal := affinitySetOf(svcAffinity(), tsLocalEP, 8080)

	for _, tc := range []struct {
		name string
		p    nfttest.Packet
		want []string
	}{
		// Cross-node pod traffic leaves masqueraded by the pod egress
		// rule, so a remote endpoint always shows masquerade.
		{"pod to ClusterIP reaches both ready endpoints, not the unready one", tcp(tsPod, ip("10.96.0.10"), 80),
			[]string{"dnat to 10.42.0.5:8080", "dnat to 10.42.1.7:8080, masquerade"}},
		{"node to ClusterIP is masqueraded", out(tcp(tsNode, ip("10.96.0.10"), 80)),
			[]string{"dnat to 10.42.0.5:8080, masquerade", "dnat to 10.42.1.7:8080, masquerade"}},
		{"outside client to ClusterIP is masqueraded", tcp(tsClient, ip("10.96.0.10"), 80),
			[]string{"dnat to 10.42.0.5:8080, masquerade", "dnat to 10.42.1.7:8080, masquerade"}},
		{"pod reaching itself through the Service is masqueraded", tcp(tsLocalEP, ip("10.96.0.10"), 80),
			[]string{"dnat to 10.42.0.5:8080, masquerade", "dnat to 10.42.1.7:8080, masquerade"}},
		{"other port of a ClusterIP is not DNATed (only egress masquerade)", tcp(tsPod, ip("10.96.0.10"), 81), []string{"masquerade"}},
		{"UDP ClusterIP", nfttest.Packet{Src: tsPod, Dst: ip("10.96.0.53"), Protocol: "UDP", Port: 53},
			[]string{"dnat to 10.42.0.6:53"}},
		{"UDP ClusterIP does not take TCP", tcp(tsPod, ip("10.96.0.53"), 53), []string{"masquerade"}},
		{"SCTP ClusterIP", nfttest.Packet{Src: tsPod, Dst: ip("10.96.0.20"), Protocol: "SCTP", Port: 3868},
			[]string{"dnat to 10.42.1.7:3868, masquerade"}},
		{"NodePort from outside reaches every endpoint, masqueraded", tcp(tsClient, tsNode, 30080),
			[]string{"dnat to 10.42.0.5:8080, masquerade", "dnat to 10.42.1.7:8080, masquerade"}},
		{"NodePort on another node address", tcp(tsClient, tsNode2, 30080),
			[]string{"dnat to 10.42.0.5:8080, masquerade", "dnat to 10.42.1.7:8080, masquerade"}},
		{"NodePort from the node", out(tcp(tsNode, tsNode, 30080)),
			[]string{"dnat to 10.42.0.5:8080, masquerade", "dnat to 10.42.1.7:8080, masquerade"}},
		{"NodePort on loopback is not a NodePort", out(tcp(ip("127.0.0.1"), ip("127.0.0.1"), 30080)), []string{"accept"}},
		{"NodePort on a non-local address is not a NodePort", tcp(tsClient, ip("192.0.2.99"), 30080), []string{"accept"}},
		{"external IP", tcp(tsClient, ip("198.51.100.7"), 80), []string{"dnat to 10.42.1.7:8080, masquerade"}},
		{"load-balancer IP", tcp(tsClient, ip("203.0.113.5"), 443), []string{"dnat to 10.42.0.5:8443, masquerade"}},
		{"load-balancer NodePort", tcp(tsClient, tsNode, 30443), []string{"dnat to 10.42.0.5:8443, masquerade"}},

		{"affinity: a new client may go to either endpoint and is remembered", tcp(tsPod, ip("10.96.0.40"), 80), []string{
			"dnat to 10.42.0.5:8080, update @" + stickyLocal,
			"dnat to 10.42.1.7:8080, masquerade, update @" + sticky,
		}},

		{"internalTrafficPolicy Local: only the local endpoint", tcp(tsPod, ip("10.96.0.50"), 80),
			[]string{"dnat to 10.42.0.5:8080"}},

		{"externalTrafficPolicy Local: NodePort keeps the client address, local endpoint only", tcp(tsClient, tsNode, 30060),
			[]string{"dnat to 10.42.0.5:8080"}},
		{"externalTrafficPolicy Local: load-balancer IP likewise", tcp(tsClient, ip("203.0.113.6"), 80),
			[]string{"dnat to 10.42.0.5:8080"}},
		{"externalTrafficPolicy Local: pods reach every endpoint", tcp(tsPod, tsNode, 30060),
			[]string{"dnat to 10.42.0.5:8080", "dnat to 10.42.1.7:8080, masquerade"}},
		{"externalTrafficPolicy Local: the node reaches every endpoint, masqueraded", out(tcp(tsNode, tsNode, 30060)),
			[]string{"dnat to 10.42.0.5:8080, masquerade", "dnat to 10.42.1.7:8080, masquerade"}},
		{"externalTrafficPolicy Local: ClusterIP is not affected", tcp(tsPod, ip("10.96.0.60"), 80),
			[]string{"dnat to 10.42.0.5:8080", "dnat to 10.42.1.7:8080, masquerade"}},

		{"externalTrafficPolicy Local without local endpoints drops outside NodePort traffic", tcp(tsClient, tsNode, 30061), []string{"drop"}},
		{"... and outside load-balancer traffic", tcp(tsClient, ip("203.0.113.7"), 80), []string{"drop"}},
		{"... but pods still reach the endpoint through the NodePort", tcp(tsPod, tsNode, 30061),
			[]string{"dnat to 10.42.1.7:8080, masquerade"}},
		{"... and through the load-balancer IP", tcp(tsPod, ip("203.0.113.7"), 80),
			[]string{"dnat to 10.42.1.7:8080, masquerade"}},
		{"... and through the ClusterIP", tcp(tsPod, ip("10.96.0.61"), 80),
			[]string{"dnat to 10.42.1.7:8080, masquerade"}},

		{"no endpoints: ClusterIP rejects pods", tcp(tsPod, ip("10.96.0.70"), 80), []string{"reject"}},
		{"no endpoints: ClusterIP rejects the node", out(tcp(tsNode, ip("10.96.0.70"), 80)), []string{"reject"}},
		{"no endpoints: NodePort rejects", tcp(tsClient, tsNode, 30070), []string{"reject"}},
		{"no endpoints: NodePort without a chain rejects", tcp(tsClient, tsNode, 30071), []string{"reject"}},
		{"no endpoints: ... its ClusterIP too", tcp(tsPod, ip("10.96.0.71"), 80), []string{"reject"}},
		{"no endpoints: external IP rejects", tcp(tsClient, ip("198.51.100.8"), 80), []string{"reject"}},

		{"only terminating endpoints: the serving one is used", tcp(tsPod, ip("10.96.0.80"), 80),
			[]string{"dnat to 10.42.0.5:8080"}},

		{"dual-stack: IPv4 goes to the IPv4 endpoint", tcp(tsPod, ip("10.96.0.90"), 80), []string{"dnat to 10.42.0.5:8080"}},
		{"dual-stack: IPv6 goes to the IPv6 endpoint", tcp(tsPod6, ip("fd00:96::90"), 80), []string{"dnat to [fd00:42::5]:8080, masquerade"}},
		{"dual-stack NodePort: IPv4 goes to the IPv4 endpoint", tcp(tsClient, tsNode, 30090), []string{"dnat to 10.42.0.5:8080, masquerade"}},
		{"dual-stack NodePort: IPv6 goes to the IPv6 endpoint", tcp(ip("2001:db8::99"), tsNode6, 30090), []string{"dnat to [fd00:42::5]:8080, masquerade"}},
		{"dual-stack NodePort: IPv6 loopback is not a NodePort", out(tcp(netip.IPv6Loopback(), netip.IPv6Loopback(), 30090)), []string{"accept"}},

		{"hostPort from outside", tcp(tsClient, tsNode, 8443), []string{"dnat to 10.42.0.7:8080"}},
		{"hostPort from the node", out(tcp(tsNode, tsNode, 8443)), []string{"dnat to 10.42.0.7:8080"}},
		{"hostPort on loopback is left alone", out(tcp(ip("127.0.0.1"), ip("127.0.0.1"), 8443)), []string{"accept"}},
		{"hostPort from another pod is masqueraded (hairpin)", tcp(tsPod, tsNode, 8443), []string{"dnat to 10.42.0.7:8080, masquerade"}},
		{"hostPort from its own pod is masqueraded (hairpin)", tcp(tsHPPod, tsNode, 8443), []string{"dnat to 10.42.0.7:8080, masquerade"}},
		{"hostPort with a host IP", nfttest.Packet{Src: tsClient, Dst: tsNode, Protocol: "UDP", Port: 5353}, []string{"dnat to 10.42.0.8:53"}},
		{"hostPort with a host IP, other local address", nfttest.Packet{Src: tsClient, Dst: tsNode2, Protocol: "UDP", Port: 5353}, []string{"accept"}},
		{"SCTP hostPort", nfttest.Packet{Src: tsClient, Dst: tsNode, Protocol: "SCTP", Port: 3868}, []string{"dnat to 10.42.0.8:3868"}},
		{"pod egress is masqueraded", tcp(tsPod, ip("93.184.216.34"), 443), []string{"masquerade"}},
		{"pod to pod is not", tcp(tsPod, tsLocalEP, 8080), []string{"accept"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := traceOutcomes(t, f, tc.p); !slices.Equal(got, tc.want) {
				t.Errorf("trace %+v =\n\t%s\nwant\n\t%s", tc.p, strings.Join(got, "\n\t"), strings.Join(tc.want, "\n\t"))
			}
		})
	}

	t.Run("affinity: a remembered client goes to its endpoint only", func(t *testing.T) {
		if err := f.AddSetElement(sticky, tsPod); err != nil {
			t.Fatal(err)
		}
		want := []string{"dnat to 10.42.1.7:8080, masquerade, update @" + sticky}
		if got := traceOutcomes(t, f, tcp(tsPod, ip("10.96.0.40"), 80)); !slices.Equal(got, want) {
			t.Errorf("remembered client: %q, want %q", got, want)
		}
		if got := traceOutcomes(t, f, tcp(ip("10.42.0.4"), ip("10.96.0.40"), 80)); len(got) != 2 {
			t.Errorf("another client: %q, want both endpoints", got)
		}
	})
}

// TestAppendKey: chain names are built from ServicePort.String.
func TestAppendKey(t *testing.T) {
	for _, sp := range tsState().Services {
		sp.Protocol = strings.ToLower(sp.Protocol)
		for _, p := range []string{"", "p"} {
			sp.PortName = p
			if got, want := string(nft.AppendKey(nil, &sp)), sp.String(); got != want {
				t.Errorf("appendKey = %q, want %q", got, want)
			}
		}
	}
}

// TestHashName: names are prefix-HASH-readable, the hash over the
// readable part, and never longer than the kernel takes.
func TestHashName(t *testing.T) {
	sp := svcClusterIP()
	if got, want := nft.HashName(sp.String()), "SUSTUHLJ-default/web/tcp/http"; got != want {
		t.Errorf("hashName = %q, want %q", got, want)
	}
	e := nft.EndpointReadable(sp.String(), servicemodel.Endpoint{Addr: ip("fd00::1"), Port: 80})
	if want := "default/web/tcp/http__fd00..1/80"; e != want {
		t.Errorf("endpointReadable = %q, want %q", e, want)
	}
	long := strings.Repeat("n", 63) + "/" + strings.Repeat("s", 63) + "/sctp/" + strings.Repeat("p", 15) + "__" + strings.Repeat("f", 39) + "/65535"
	if n := len(nft.PrefixEndpoint + nft.HashName(long)); n > nft.MaxNameLen {
		t.Errorf("longest endpoint chain name is %d bytes", n)
	}
}

// TestSyncRejectsBadState: nothing is applied for an invalid State.
func TestSyncRejectsBadState(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    nft.State
		want string
	}{
		{"no pod CIDR", nft.State{}, "pod CIDR is not set"},
		{"pod CIDR not a network", nft.State{PodCIDR: netip.MustParsePrefix("10.42.0.1/24")}, "not a network address"},
		{"bad hostPort", nft.State{PodCIDR: tsPodCIDR, HostPorts: []nft.HostPort{{HostPort: 1, ContainerPort: 1}}}, "pod IP is not set"},
		{"bad protocol", nft.State{PodCIDR: tsPodCIDR, Services: []servicemodel.ServicePort{{Namespace: "a", Name: "b", Protocol: "ICMP", Port: 1}}}, `protocol "ICMP"`},
		{"no port", nft.State{PodCIDR: tsPodCIDR, Services: []servicemodel.ServicePort{{Namespace: "a", Name: "b", Protocol: "TCP"}}}, "port is not set"},
		{"bad endpoint", nft.State{PodCIDR: tsPodCIDR, Services: []servicemodel.ServicePort{{Namespace: "a", Name: "b", Protocol: "TCP", Port: 1, Endpoints: []servicemodel.Endpoint{{Addr: tsPod}}}}}, "address and port must be set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := nfttest.NewFake()
			tb := nft.NewTable(f)
			for _, full := range []bool{true, false} {
				if !full {
					if _, err := tb.Sync(nft.State{PodCIDR: tsPodCIDR}); err != nil {
						t.Fatal(err)
					}
				}
				before := f.Ops()
				_, err := tb.Sync(tc.s)
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("Sync (full %v) = %v, want an error containing %q", full, err, tc.want)
				}
				if f.Ops() != before {
					t.Errorf("Sync (full %v) applied %d ops", full, f.Ops()-before)
				}
			}
		})
	}
}

// TestTableBalancesEvenly: over 1 to 6 ready endpoints, the numgen
// cascade sends each endpoint the same share of new connections.
// TestTableBalancesDualStackEvenly: a dual-stack Service's cascade rules
// carry no family match, so a packet of one family passes the other
// family's rules (the kernel's inet nat leaves it alone) whatever their
// draws; each family's endpoints must still share its connections
// evenly, and no packet may reach the other family's.
func TestTableBalancesDualStackEvenly(t *testing.T) {
	for n4 := 1; n4 <= 3; n4++ {
		for n6 := 1; n6 <= 3; n6++ {
			sp := svcDualStack()
			sp.Endpoints = nil
			for i := range n4 {
				sp.Endpoints = append(sp.Endpoints, ready(netip.AddrFrom4([4]byte{10, 42, 1, byte(10 + i)}), 8080, false))
			}
			for i := range n6 {
				sp.Endpoints = append(sp.Endpoints, ready(netip.MustParseAddr(fmt.Sprintf("fd00:42::1:%d", 10+i)), 8080, false))
			}
			f, _ := synced(t, nft.State{PodCIDR: tsPodCIDR, Services: []servicemodel.ServicePort{sp}})
			for _, c := range []struct {
				src, dst netip.Addr
				n        int
			}{{tsPod, sp.ClusterIPs[0], n4}, {tsPod6, sp.ClusterIPs[1], n6}} {
				outs, err := f.Trace(nfttest.Packet{Src: c.src, Dst: c.dst, Protocol: "TCP", Port: 80}, tsIsLocal)
				if err != nil {
					t.Fatal(err)
				}
				shares := map[netip.AddrPort]float64{}
				for _, o := range outs {
					if o.DNAT.Addr().Is6() != c.dst.Is6() {
						t.Errorf("%d+%d endpoints: %s reached %s", n4, n6, c.dst, o.DNAT)
					}
					shares[o.DNAT] += o.Share
				}
				if len(shares) != c.n {
					t.Errorf("%d+%d endpoints: %s reached %d: %v", n4, n6, c.dst, len(shares), shares)
				}
				for ep, s := range shares {
					if math.Abs(s-1/float64(c.n)) > 1e-9 {
						t.Errorf("%d+%d endpoints: %s: %s gets %.4f of connections, want %.4f", n4, n6, c.dst, ep, s, 1/float64(c.n))
					}
				}
			}
		}
	}
}

func TestTableBalancesEvenly(t *testing.T) {
	// Up to maxGroup endpoints through the shared rules, past it through
	// the Service's own chain.
	for n := 1; n <= nft.MaxGroup+2; n++ {
		sp := svcClusterIP()
		sp.Endpoints = nil
		for i := range n {
			sp.Endpoints = append(sp.Endpoints, ready(netip.AddrFrom4([4]byte{10, 42, 1, byte(10 + i)}), 8080, false))
		}
		f, _ := synced(t, nft.State{PodCIDR: tsPodCIDR, Services: []servicemodel.ServicePort{sp}})
		outs, err := f.Trace(nfttest.Packet{Src: tsPod, Dst: ip("10.96.0.10"), Protocol: "TCP", Port: 80}, tsIsLocal)
		if err != nil {
			t.Fatal(err)
		}
		shares := map[netip.AddrPort]float64{}
		for _, o := range outs {
			shares[o.DNAT] += o.Share
		}
		if len(shares) != n {
			t.Errorf("%d endpoints: reached %d: %v", n, len(shares), shares)
		}
		for ep, s := range shares {
			if math.Abs(s-1/float64(n)) > 1e-9 {
				t.Errorf("%d endpoints: %s gets %.4f of connections, want %.4f", n, ep, s, 1/float64(n))
			}
		}
	}
}
