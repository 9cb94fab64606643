package proxy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/outpost-edge/outpost/netproxy/nfttest"
	"github.com/outpost-edge/outpost/store"
)

// TestSyncIncrementalMatchesFull: through a fixed-seed run of store
// writes (API Services and slices put, changed, relabelled and deleted,
// a standalone Service, local pods' readiness and addresses), each sync
// reads only what changed, and leaves the table as a new proxy's first
// sync of the same store does; a sync after nothing changed applies
// nothing.
func TestSyncIncrementalMatchesFull(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	st := openStore(t)
	ag := newAgent(true)
	f := nfttest.NewFake()
	p := newProxy(t, Config{}, Deps{Store: st, Ruleset: f, LocalPods: ag.LocalPods})
	put(t, st.Services(), store.SourceStatic, webService())
	pods := []*corev1.Pod{newPod("web-a", "web"), newPod("web-b", "web")}
	addrs := []netip.Addr{podAIP, podBIP, remoteIP, netip.MustParseAddr("10.42.1.8")}
	const nsvc = 8
	svc := func(i int) *corev1.Service {
		proto := []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP}[rng.IntN(2)]
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("s%d", i)},
			Spec: corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.96.1.%d", 10+rng.IntN(4)),
				Ports: []corev1.ServicePort{{Name: "p", Port: int32(80 + rng.IntN(2)), TargetPort: intstr.FromString("p"), Protocol: proto}}},
		}
		if rng.IntN(4) == 0 {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "q", Port: 90, Protocol: proto})
		}
		if rng.IntN(4) == 0 {
			s.Spec.Type, s.Spec.Ports[0].NodePort = corev1.ServiceTypeNodePort, int32(30000+i)
		}
		return s
	}
	slice := func(i, j int) *discoveryv1.EndpointSlice {
		sl := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("s%d-%d", i, j), Labels: map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("s%d", rng.IntN(nsvc))}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("p"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
		}
		for _, a := range addrs {
			if rng.IntN(2) == 0 {
				continue
			}
			nodeName, pod := "n2", (*corev1.Pod)(nil)
			if podCIDR.Contains(a) {
				nodeName, pod = node, pods[slices.Index(addrs, a)]
			}
			sl.Endpoints = append(sl.Endpoints, sliceEndpoint(a, nodeName, rng.IntN(3) > 0, pod))
		}
		if rng.IntN(2) == 0 {
			sl.Ports[0].Protocol = ptr(corev1.ProtocolUDP)
		}
		return sl
	}
	for step := range 300 {
		switch k := rng.IntN(8); k {
		case 0, 1:
			put(t, st.Services(), store.SourceAPI, svc(rng.IntN(nsvc)))
		case 2:
			if _, err := st.Services().Delete("default", fmt.Sprintf("s%d", rng.IntN(nsvc))); err != nil {
				t.Fatal(err)
			}
		case 3, 4:
			put(t, st.EndpointSlices(), store.SourceAPI, slice(rng.IntN(nsvc), rng.IntN(2)))
		case 5:
			if _, err := st.EndpointSlices().Delete("default", fmt.Sprintf("s%d-%d", rng.IntN(nsvc), rng.IntN(2))); err != nil {
				t.Fatal(err)
			}
		case 6:
			i := rng.IntN(len(pods))
			ag.set(pods[i], addrs[i], rng.IntN(2) == 0)
		default:
			// Several writes in one sync.
			for range 3 {
				i := rng.IntN(nsvc)
				put(t, st.Services(), store.SourceAPI, svc(i))
				put(t, st.EndpointSlices(), store.SourceAPI, slice(i, 0))
			}
		}
		mustSync(t, p)
		fresh := nfttest.NewFake()
		q := newProxy(t, Config{}, Deps{Store: st, Ruleset: fresh, LocalPods: ag.LocalPods})
		mustSync(t, q)
		q.feed.Close()
		if got, want := f.Dump(), fresh.Dump(); got != want {
			t.Fatalf("step %d: after an incremental sync:\n%s\nwant (a first sync):\n%s", step, got, want)
		}
		if got, want := p.Stats().Services, q.Stats().Services; got != want {
			t.Fatalf("step %d: %d service ports, a first sync has %d", step, got, want)
		}
		mustSync(t, p)
		if ops := p.Stats().LastOps; ops != 0 {
			t.Fatalf("step %d: a sync after no change applied %d ops", step, ops)
		}
	}
}

// TestSyncConntrackAPI: a sync that reads only what changed deletes the
// UDP flows to the endpoints its change took away, of a Service from the
// API server whose slice changed, and of one deleted.
func TestSyncConntrackAPI(t *testing.T) {
	st := openStore(t)
	dns := dnsService()
	dns.Spec.Selector = nil
	put(t, st.Services(), store.SourceAPI, dns)
	sl := func(eps ...netip.Addr) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "dns-1", Labels: map[string]string{discoveryv1.LabelServiceName: "dns"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Port: ptr(int32(5353)), Protocol: ptr(corev1.ProtocolUDP)}},
		}
		for _, a := range eps {
			s.Endpoints = append(s.Endpoints, sliceEndpoint(a, "n2", true, nil))
		}
		return s
	}
	other := netip.MustParseAddr("10.42.1.8")
	put(t, st.EndpointSlices(), store.SourceAPI, sl(remoteIP, other))
	ct := &recorder{}
	p := newProxy(t, Config{}, Deps{Store: st, Ruleset: nfttest.NewFake(), Conntrack: ct})
	check := conntrackCheck(t, p, ct)
	check("first sync")
	put(t, st.EndpointSlices(), store.SourceAPI, sl(remoteIP))
	check("endpoint gone", []string{
		"udp dst=invalid IP:30053 reply-src=10.42.1.8",
		"udp dst=10.96.0.53:53 reply-src=10.42.1.8",
		"udp dst=192.0.2.100:53 reply-src=10.42.1.8",
	})
	check("unchanged")
	if _, err := st.Services().Delete("default", "dns"); err != nil {
		t.Fatal(err)
	}
	check("service gone", []string{
		"udp dst=invalid IP:30053 reply-src=10.42.1.7",
		"udp dst=10.96.0.53:53 reply-src=10.42.1.7",
		"udp dst=192.0.2.100:53 reply-src=10.42.1.7",
	})
}
