package proxy

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/outpost-edge/outpost/netproxy/nfttest"
	"github.com/outpost-edge/outpost/store"
)

// recorder is a Conntrack that records its calls.
type recorder struct {
	mu    sync.Mutex
	calls [][]Filter
	err   error
}

func (r *recorder) DeleteUDP(filters []Filter) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, slices.Clone(filters))
	return len(filters), r.err
}

func (r *recorder) take() [][]Filter {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.calls
	r.calls = nil
	return c
}

func filterStrings(fs []Filter) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.String())
	}
	return out
}

var (
	dnsIP      = netip.MustParseAddr("10.96.0.53")
	dnsExtIP   = netip.MustParseAddr("192.0.2.100")
	dnsA, dnsB = netip.AddrPortFrom(podAIP, 5353), netip.AddrPortFrom(podBIP, 5353)
)

func dnsPort(eps ...netip.AddrPort) udpPort {
	return udpPort{dests: []netip.Addr{dnsIP, dnsExtIP}, port: 53, nodePort: 30053, endpoints: eps}
}

func TestStaleFlows(t *testing.T) {
	const key = "default/dns/udp/53"
	for _, tc := range []struct {
		name       string
		prev, next map[string]udpPort
		want       []string
	}{
		{"unchanged", map[string]udpPort{key: dnsPort(dnsA, dnsB)}, map[string]udpPort{key: dnsPort(dnsA, dnsB)}, nil},
		{"endpoint removed", map[string]udpPort{key: dnsPort(dnsA, dnsB)}, map[string]udpPort{key: dnsPort(dnsA)}, []string{
			"udp dst=invalid IP:30053 reply-src=10.42.0.6",
			"udp dst=10.96.0.53:53 reply-src=10.42.0.6",
			"udp dst=192.0.2.100:53 reply-src=10.42.0.6",
		}},
		{"endpoint port changed", map[string]udpPort{key: dnsPort(dnsA)}, map[string]udpPort{key: dnsPort(netip.AddrPortFrom(podAIP, 5354))}, []string{
			"udp dst=invalid IP:30053 reply-src=10.42.0.5",
			"udp dst=10.96.0.53:53 reply-src=10.42.0.5",
			"udp dst=192.0.2.100:53 reply-src=10.42.0.5",
		}},
		{"service removed", map[string]udpPort{key: dnsPort(dnsA, dnsB)}, map[string]udpPort{}, []string{
			"udp dst=invalid IP:30053 reply-src=10.42.0.5",
			"udp dst=invalid IP:30053 reply-src=10.42.0.6",
			"udp dst=10.96.0.53:53 reply-src=10.42.0.5",
			"udp dst=10.96.0.53:53 reply-src=10.42.0.6",
			"udp dst=192.0.2.100:53 reply-src=10.42.0.5",
			"udp dst=192.0.2.100:53 reply-src=10.42.0.6",
		}},
		{"no endpoint to some", map[string]udpPort{key: dnsPort()}, map[string]udpPort{key: dnsPort(dnsA, dnsB)}, []string{
			"udp dst=invalid IP:30053",
			"udp dst=10.96.0.53:53",
			"udp dst=192.0.2.100:53",
		}},
		{"new service with endpoints", map[string]udpPort{}, map[string]udpPort{key: dnsPort(dnsA)}, []string{
			"udp dst=invalid IP:30053",
			"udp dst=10.96.0.53:53",
			"udp dst=192.0.2.100:53",
		}},
		{"some to no endpoint", map[string]udpPort{key: dnsPort(dnsA)}, map[string]udpPort{key: dnsPort()}, []string{
			"udp dst=invalid IP:30053 reply-src=10.42.0.5",
			"udp dst=10.96.0.53:53 reply-src=10.42.0.5",
			"udp dst=192.0.2.100:53 reply-src=10.42.0.5",
		}},
		{"no node port", map[string]udpPort{key: {dests: []netip.Addr{dnsIP}, port: 53, endpoints: []netip.AddrPort{dnsA, dnsB}}},
			map[string]udpPort{key: {dests: []netip.Addr{dnsIP}, port: 53, endpoints: []netip.AddrPort{dnsB}}}, []string{
				"udp dst=10.96.0.53:53 reply-src=10.42.0.5",
			}},
		{"other service untouched", map[string]udpPort{key: dnsPort(dnsA), "default/other/udp/53": {dests: []netip.Addr{netip.MustParseAddr("10.96.0.54")}, port: 53, endpoints: []netip.AddrPort{dnsB}}},
			map[string]udpPort{"default/other/udp/53": {dests: []netip.Addr{netip.MustParseAddr("10.96.0.54")}, port: 53, endpoints: []netip.AddrPort{dnsB}}}, []string{
				"udp dst=invalid IP:30053 reply-src=10.42.0.5",
				"udp dst=10.96.0.53:53 reply-src=10.42.0.5",
				"udp dst=192.0.2.100:53 reply-src=10.42.0.5",
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := filterStrings(staleFlows(tc.prev, tc.next))
			if !slices.Equal(got, tc.want) {
				t.Errorf("staleFlows =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// dnsService is a UDP NodePort Service 10.96.0.53:53 (node port 30053)
// with an external IP, selecting app=dns on port 5353.
func dnsService() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "dns"},
		Spec: corev1.ServiceSpec{
			Type:        corev1.ServiceTypeNodePort,
			Selector:    map[string]string{"app": "dns"},
			ClusterIP:   dnsIP.String(),
			ExternalIPs: []string{dnsExtIP.String()},
			Ports:       []corev1.ServicePort{{Port: 53, TargetPort: intstr.FromInt32(5353), NodePort: 30053, Protocol: corev1.ProtocolUDP}},
		},
	}
}

// conntrackCheck returns a check that syncs p and compares the DeleteUDP
// calls ct saw with want, one []string of filters per call.
func conntrackCheck(t *testing.T, p *Proxy, ct *recorder) func(what string, want ...[]string) {
	return func(what string, want ...[]string) {
		t.Helper()
		mustSync(t, p)
		var got [][]string
		for _, c := range ct.take() {
			got = append(got, filterStrings(c))
		}
		if !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("%s: DeleteUDP calls %q, want %q", what, got, want)
		}
	}
}

// TestSyncConntrack: Sync deletes the UDP flows its change made stale,
// not on the first sync (what an earlier run applied is not known), and
// a failing deletion does not fail the sync.
func TestSyncConntrack(t *testing.T) {
	st := openStore(t)
	put(t, st.Services(), store.SourceStatic, dnsService())
	put(t, st.Services(), store.SourceStatic, webService()) // TCP: never
	a, b, w := newPod("dns-a", "dns"), newPod("dns-b", "dns"), newPod("web-a", "web")
	ag := newAgent(true)
	ag.set(a, podAIP, true)
	ag.set(b, podBIP, true)
	ag.set(w, netip.MustParseAddr("10.42.0.9"), true)
	ct := &recorder{}
	p := newProxy(t, Config{}, Deps{Store: st, Ruleset: nfttest.NewFake(), LocalPods: ag.LocalPods, Conntrack: ct})

	check := conntrackCheck(t, p, ct)
	check("first sync")
	check("unchanged")
	ag.set(w, netip.MustParseAddr("10.42.0.9"), false)
	check("TCP endpoint gone")
	ag.set(b, podBIP, false)
	check("endpoint gone", []string{
		"udp dst=invalid IP:30053 reply-src=10.42.0.6",
		"udp dst=10.96.0.53:53 reply-src=10.42.0.6",
		"udp dst=192.0.2.100:53 reply-src=10.42.0.6",
	})
	ag.set(a, podAIP, false)
	check("last endpoint gone", []string{
		"udp dst=invalid IP:30053 reply-src=10.42.0.5",
		"udp dst=10.96.0.53:53 reply-src=10.42.0.5",
		"udp dst=192.0.2.100:53 reply-src=10.42.0.5",
	})
	ag.set(a, podAIP, true)
	check("an endpoint again", []string{
		"udp dst=invalid IP:30053",
		"udp dst=10.96.0.53:53",
		"udp dst=192.0.2.100:53",
	})
	ct.err = errors.New("injected failure")
	ag.set(a, podAIP, false)
	check("failing deletion", []string{
		"udp dst=invalid IP:30053 reply-src=10.42.0.5",
		"udp dst=10.96.0.53:53 reply-src=10.42.0.5",
		"udp dst=192.0.2.100:53 reply-src=10.42.0.5",
	})
}
