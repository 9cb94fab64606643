package servicemodel

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/store"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const node = "pi-1"

func ptr[T any](v T) *T { return &v }

// service is a ClusterIP Service in namespace default with the given
// cluster IPs and ports, changed by mods.
func service(name string, clusterIPs []string, ports []corev1.ServicePort, mods ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIPs: clusterIPs, Ports: ports},
	}
	if len(clusterIPs) > 0 {
		s.Spec.ClusterIP = clusterIPs[0]
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

func svcPort(name string, proto corev1.Protocol, port int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: port}
}

func fromAPI(svcs ...*corev1.Service) []store.Record[*corev1.Service] {
	return records(store.SourceAPI, svcs...)
}

func records(src store.Source, svcs ...*corev1.Service) []store.Record[*corev1.Service] {
	var out []store.Record[*corev1.Service]
	for _, s := range svcs {
		out = append(out, store.Record[*corev1.Service]{Source: src, Object: s})
	}
	return out
}

// slice is an EndpointSlice of Service svc in namespace default.
func slice(name, svc string, family discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: family,
		Ports:       ports,
		Endpoints:   eps,
	}
}

func slicePort(name string, proto corev1.Protocol, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr(name), Protocol: ptr(proto), Port: ptr(port)}
}

func sliceRecords(ss ...*discoveryv1.EndpointSlice) []store.Record[*discoveryv1.EndpointSlice] {
	var out []store.Record[*discoveryv1.EndpointSlice]
	for _, s := range ss {
		out = append(out, store.Record[*discoveryv1.EndpointSlice]{Source: store.SourceAPI, Object: s})
	}
	return out
}

// ep is a slice endpoint on nodeName ("" for none) with the given
// conditions (nil for unset).
func ep(addr, nodeName string, ready, serving, terminating *bool) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{
		Addresses:  []string{addr},
		Conditions: discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating},
	}
	if nodeName != "" {
		e.NodeName = ptr(nodeName)
	}
	return e
}

// readyEP is a ready endpoint on nodeName.
func readyEP(addr, nodeName string) discoveryv1.Endpoint {
	return ep(addr, nodeName, ptr(true), ptr(true), ptr(false))
}

// withRef sets the endpoint's targetRef to the pod of that uid.
func withRef(e discoveryv1.Endpoint, uid string) discoveryv1.Endpoint {
	e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "default", UID: types.UID(uid)}
	return e
}

// localPod is a pod of namespace default named name (uid "uid-"+name)
// with the given labels, readiness and addresses.
func localPod(name string, labels map[string]string, ready bool, ips ...string) LocalPod {
	lp := LocalPod{
		Pod: &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name), Labels: labels},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c"}}},
		},
		Ready: ready,
	}
	for _, ip := range ips {
		lp.IPs = append(lp.IPs, netip.MustParseAddr(ip))
	}
	return lp
}

// deleting marks a local pod as being deleted.
func deleting(lp LocalPod) LocalPod {
	lp.Pod.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
	return lp
}

// withPorts gives a local pod's container these ports.
func withPorts(lp LocalPod, ports ...corev1.ContainerPort) LocalPod {
	lp.Pod.Spec.Containers[0].Ports = ports
	return lp
}

func inNamespace(lp LocalPod, ns string) LocalPod {
	lp.Pod.Namespace = ns
	return lp
}

func hostNetwork(lp LocalPod) LocalPod {
	lp.Pod.Spec.HostNetwork = true
	return lp
}

// dump renders service ports one a line, each field that is not zero,
// then their endpoints indented, one a line with their set conditions.
func dump(sps []ServicePort) string {
	var b strings.Builder
	for _, sp := range sps {
		fmt.Fprintf(&b, "%s %s port=%d", sp, sp.Protocol, sp.Port)
		addrs := func(name string, as []netip.Addr) {
			if len(as) > 0 {
				var ss []string
				for _, a := range as {
					ss = append(ss, a.String())
				}
				fmt.Fprintf(&b, " %s=%s", name, strings.Join(ss, ","))
			}
		}
		addrs("clusterIPs", sp.ClusterIPs)
		if sp.NodePort != 0 {
			fmt.Fprintf(&b, " nodePort=%d", sp.NodePort)
		}
		addrs("externalIPs", sp.ExternalIPs)
		addrs("lbIPs", sp.LoadBalancerIPs)
		if sp.AffinityTimeout != 0 {
			fmt.Fprintf(&b, " affinity=%s", sp.AffinityTimeout)
		}
		if sp.InternalLocal {
			b.WriteString(" internalLocal")
		}
		if sp.ExternalLocal {
			b.WriteString(" externalLocal")
		}
		b.WriteString("\n")
		for _, e := range sp.Endpoints {
			fmt.Fprintf(&b, "  %s", netip.AddrPortFrom(e.Addr, e.Port))
			for _, f := range []struct {
				set  bool
				name string
			}{{e.Ready, "ready"}, {e.Serving, "serving"}, {e.Terminating, "terminating"}, {e.Local, "local"}} {
				if f.set {
					b.WriteString(" " + f.name)
				}
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

func TestBuild(t *testing.T) {
	v4, v6 := discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	web := func(mods ...func(*corev1.Service)) *corev1.Service {
		return service("web", []string{"10.96.0.10"}, []corev1.ServicePort{svcPort("", tcp, 80)}, mods...)
	}
	webSlice := func(eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return slice("web-1", "web", v4, []discoveryv1.EndpointPort{slicePort("", tcp, 8080)}, eps...)
	}
	appWeb := map[string]string{"app": "web"}
	selectWeb := func(s *corev1.Service) { s.Spec.Selector = map[string]string{"app": "web"} }

	tests := []struct {
		name     string
		services []store.Record[*corev1.Service]
		slices   []*discoveryv1.EndpointSlice
		pods     []LocalPod
		want     string
		wantErrs []string
	}{
		{
			name:     "api service, endpoints from its slice, local by node name",
			services: fromAPI(web()),
			slices:   []*discoveryv1.EndpointSlice{webSlice(readyEP("10.244.1.5", "pi-2"), readyEP("10.244.0.5", node))},
			want: `default/web/tcp/80 TCP port=80 clusterIPs=10.96.0.10
  10.244.0.5:8080 ready serving local
  10.244.1.5:8080 ready serving
`,
		},
		{
			name:     "conditions: ready unset is true, serving unset follows ready, terminating unset is false",
			services: fromAPI(web()),
			slices: []*discoveryv1.EndpointSlice{webSlice(
				ep("10.0.0.1", "", nil, nil, nil),
				ep("10.0.0.2", "", ptr(false), nil, nil),
				ep("10.0.0.3", "", ptr(false), ptr(true), ptr(true)),
				ep("10.0.0.4", "", ptr(false), ptr(false), ptr(true)),
			)},
			want: `default/web/tcp/80 TCP port=80 clusterIPs=10.96.0.10
  10.0.0.1:8080 ready serving
  10.0.0.2:8080
  10.0.0.3:8080 serving terminating
  10.0.0.4:8080 terminating
`,
		},
		{
			name: "slice ports matched by name and protocol",
			services: fromAPI(service("dns", []string{"10.96.0.53"}, []corev1.ServicePort{
				svcPort("dns", udp, 53), svcPort("dns-tcp", tcp, 53), svcPort("metrics", tcp, 9153),
			})),
			slices: []*discoveryv1.EndpointSlice{slice("dns-1", "dns", v4, []discoveryv1.EndpointPort{
				slicePort("dns", udp, 5353),
				slicePort("dns", tcp, 5300), // the name of the UDP port: not dns-tcp
				slicePort("dns-tcp", tcp, 5354),
				{Name: ptr("metrics"), Port: ptr[int32](9154)}, // protocol unset is TCP
				slicePort("other", tcp, 1),
			}, readyEP("10.244.0.9", ""))},
			want: `default/dns/tcp/dns-tcp TCP port=53 clusterIPs=10.96.0.53
  10.244.0.9:5354 ready serving
default/dns/tcp/metrics TCP port=9153 clusterIPs=10.96.0.53
  10.244.0.9:9154 ready serving
default/dns/udp/dns UDP port=53 clusterIPs=10.96.0.53
  10.244.0.9:5353 ready serving
`,
		},
		{
			name:     "only the slices of the service: not another namespace's, another service's or unlabelled",
			services: fromAPI(web()),
			slices: []*discoveryv1.EndpointSlice{
				webSlice(readyEP("10.0.0.1", "")),
				func() *discoveryv1.EndpointSlice {
					s := webSlice(readyEP("10.0.0.2", ""))
					s.Name, s.Namespace = "web-2", "other"
					return s
				}(),
				slice("api-1", "api", v4, []discoveryv1.EndpointPort{slicePort("", tcp, 8080)}, readyEP("10.0.0.3", "")),
				func() *discoveryv1.EndpointSlice {
					s := webSlice(readyEP("10.0.0.4", ""))
					s.Name, s.Labels = "web-manual", nil
					return s
				}(),
			},
			want: `default/web/tcp/80 TCP port=80 clusterIPs=10.96.0.10
  10.0.0.1:8080 ready serving
`,
		},
		{
			name:     "duplicates across slices: the ready one wins; sorted by address then port",
			services: fromAPI(web()),
			slices: []*discoveryv1.EndpointSlice{
				slice("web-a", "web", v4, []discoveryv1.EndpointPort{slicePort("", tcp, 8080)},
					ep("10.0.0.10", "", ptr(false), ptr(false), ptr(true)), readyEP("10.0.0.9", ""),
					ep("10.0.0.11", node, ptr(false), ptr(true), ptr(true))),
				slice("web-b", "web", v4, []discoveryv1.EndpointPort{slicePort("", tcp, 8080)},
					readyEP("10.0.0.10", ""), ep("10.0.0.9", "", ptr(false), nil, nil), readyEP("10.0.0.11", "")),
				slice("web-c", "web", v4, []discoveryv1.EndpointPort{slicePort("", tcp, 80)}, readyEP("10.0.0.9", "")),
			},
			want: `default/web/tcp/80 TCP port=80 clusterIPs=10.96.0.10
  10.0.0.9:80 ready serving
  10.0.0.9:8080 ready serving
  10.0.0.10:8080 ready serving
  10.0.0.11:8080 ready serving
`,
		},
		{
			name: "dual stack: both cluster IPs, slices of both families kept",
			services: fromAPI(service("web", []string{"fd00::10", "10.96.0.10"}, []corev1.ServicePort{svcPort("", tcp, 80)},
				func(s *corev1.Service) {
					s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
				})),
			slices: []*discoveryv1.EndpointSlice{
				slice("web-6", "web", v6, []discoveryv1.EndpointPort{slicePort("", tcp, 8080)}, readyEP("fd10::5", "")),
				webSlice(readyEP("10.244.0.5", "")),
			},
			want: `default/web/tcp/80 TCP port=80 clusterIPs=fd00::10,10.96.0.10
  10.244.0.5:8080 ready serving
  [fd10::5]:8080 ready serving
`,
		},
		{
			name: "single-stack service: an IPv6 slice is still collected (the renderer picks per family); clusterIP alone is read",
			services: fromAPI(service("web", nil, []corev1.ServicePort{svcPort("", tcp, 80)},
				func(s *corev1.Service) { s.Spec.ClusterIP = "10.96.0.10" })),
			slices: []*discoveryv1.EndpointSlice{slice("web-6", "web", v6, []discoveryv1.EndpointPort{slicePort("", tcp, 8080)}, readyEP("fd10::5", ""))},
			want: `default/web/tcp/80 TCP port=80 clusterIPs=10.96.0.10
  [fd10::5]:8080 ready serving
`,
		},
		{
			name:     "FQDN slices, endpoints without addresses or with bad ones, ports without numbers are skipped",
			services: fromAPI(web()),
			slices: []*discoveryv1.EndpointSlice{
				slice("web-fqdn", "web", discoveryv1.AddressTypeFQDN, []discoveryv1.EndpointPort{slicePort("", tcp, 8080)}, readyEP("example.com", ""), readyEP("10.0.0.8", "")),
				slice("web-noport", "web", v4, []discoveryv1.EndpointPort{{Name: ptr(""), Protocol: ptr(tcp)}}, readyEP("10.0.0.7", "")),
				webSlice(discoveryv1.Endpoint{}, readyEP("not-an-ip", ""), readyEP("10.0.0.1", "")),
			},
			want: `default/web/tcp/80 TCP port=80 clusterIPs=10.96.0.10
  10.0.0.1:8080 ready serving
`,
		},
		{
			name:     "local readiness override: a local pod's endpoint follows the agent, not the stale slice",
			services: fromAPI(web()),
			slices: []*discoveryv1.EndpointSlice{webSlice(
				readyEP("10.244.0.5", node),                         // the agent's probe now fails
				ep("10.244.0.6", node, ptr(false), ptr(false), nil), // the agent's probe now passes
				readyEP("10.244.0.7", "pi-2"),                       // a local pod's IP under another node: the address is here
			)},
			pods: []LocalPod{
				localPod("a", nil, false, "10.244.0.5"),
				localPod("b", nil, true, "10.244.0.6"),
				localPod("c", nil, false, "10.244.0.7"),
			},
			want: `default/web/tcp/80 TCP port=80 clusterIPs=10.96.0.10
  10.244.0.5:8080 local
  10.244.0.6:8080 ready serving local
  10.244.0.7:8080 local
`,
		},
		{
			name:     "local override: a pod being deleted is terminating, serving while ready",
			services: fromAPI(web()),
			slices:   []*discoveryv1.EndpointSlice{webSlice(readyEP("10.244.0.5", node), readyEP("10.244.0.6", node))},
			pods: []LocalPod{
				deleting(localPod("a", nil, true, "10.244.0.5")),
				deleting(localPod("b", nil, false, "10.244.0.6")),
			},
			want: `default/web/tcp/80 TCP port=80 clusterIPs=10.96.0.10
  10.244.0.5:8080 serving terminating local
  10.244.0.6:8080 terminating local
`,
		},
		{
			name:     "local override by targetRef: an address the pod no longer has serves nothing",
			services: fromAPI(web()),
			slices: []*discoveryv1.EndpointSlice{webSlice(
				withRef(readyEP("10.244.0.5", node), "uid-a"),
				withRef(ep("10.244.0.8", node, ptr(false), nil, nil), "uid-b"),
			)},
			pods: []LocalPod{
				localPod("a", nil, true, "10.244.0.9"), // had 10.244.0.5
				localPod("b", nil, true, "10.244.0.8"),
			},
			want: `default/web/tcp/80 TCP port=80 clusterIPs=10.96.0.10
  10.244.0.5:8080 local
  10.244.0.8:8080 ready serving local
`,
		},
		{
			name:     "a mirror pod's targetRef (another UID) still matches the local pod by address",
			services: fromAPI(web()),
			slices:   []*discoveryv1.EndpointSlice{webSlice(withRef(readyEP("10.244.0.5", node), "mirror-uid"))},
			pods:     []LocalPod{localPod("a", nil, false, "10.244.0.5")},
			want: `default/web/tcp/80 TCP port=80 clusterIPs=10.96.0.10
  10.244.0.5:8080 local
`,
		},
		{
			name:     "a slice endpoint of this node that is no local pod stays as the slice says",
			services: fromAPI(web()),
			slices:   []*discoveryv1.EndpointSlice{webSlice(readyEP("10.244.0.50", node), ep("10.244.0.51", node, ptr(false), ptr(true), ptr(true)))},
			pods:     []LocalPod{localPod("a", nil, false, "10.244.0.5"), localPod("noip", nil, true)},
			want: `default/web/tcp/80 TCP port=80 clusterIPs=10.96.0.10
  10.244.0.50:8080 ready serving local
  10.244.0.51:8080 serving terminating local
`,
		},
		{
			name: "hostNetwork pods share the node address: the one with that port is the endpoint",
			services: fromAPI(service("exporter", []string{"10.96.0.91"}, []corev1.ServicePort{svcPort("", tcp, 9100)}),
				service("agent", []string{"10.96.0.92"}, []corev1.ServicePort{svcPort("", tcp, 9200)})),
			slices: []*discoveryv1.EndpointSlice{
				slice("exporter-1", "exporter", v4, []discoveryv1.EndpointPort{slicePort("", tcp, 9100)}, readyEP("192.168.1.10", node)),
				// Both pods declare 9200: which one is meant is not known.
				slice("agent-1", "agent", v4, []discoveryv1.EndpointPort{slicePort("", tcp, 9200)}, readyEP("192.168.1.10", node)),
			},
			pods: []LocalPod{
				hostNetwork(withPorts(localPod("exporter", nil, false, "192.168.1.10"), corev1.ContainerPort{ContainerPort: 9100}, corev1.ContainerPort{ContainerPort: 9200})),
				hostNetwork(withPorts(localPod("agent", nil, false, "192.168.1.10"), corev1.ContainerPort{ContainerPort: 9200, Protocol: tcp})),
				hostNetwork(withPorts(inNamespace(localPod("other", nil, true, "192.168.1.10"), "kube-system"), corev1.ContainerPort{ContainerPort: 9100})),
			},
			want: `default/agent/tcp/9200 TCP port=9200 clusterIPs=10.96.0.92
  192.168.1.10:9200 ready serving local
default/exporter/tcp/9100 TCP port=9100 clusterIPs=10.96.0.91
  192.168.1.10:9100 local
`,
		},
		{
			name: "standalone service: local pods its selector matches, slices ignored",
			services: records(store.SourceStatic, service("web", []string{"10.96.0.10"},
				[]corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}, selectWeb)),
			slices: []*discoveryv1.EndpointSlice{webSlice(readyEP("10.0.0.1", ""))},
			pods: []LocalPod{
				localPod("a", map[string]string{"app": "web", "tier": "x"}, true, "10.244.0.5", "fd10::5"),
				localPod("b", appWeb, false, "10.244.0.6"),
				deleting(localPod("c", appWeb, true, "10.244.0.7")),
				localPod("noip", appWeb, true),
				localPod("other", map[string]string{"app": "api"}, true, "10.244.0.8"),
				localPod("unlabelled", nil, true, "10.244.0.9"),
				inNamespace(localPod("elsewhere", appWeb, true, "10.244.0.10"), "prod"),
				{IPs: []netip.Addr{netip.MustParseAddr("10.244.0.11")}, Ready: true}, // no pod: ignored
			},
			want: `default/web/tcp/80 TCP port=80 clusterIPs=10.96.0.10
  10.244.0.5:8080 ready serving local
  10.244.0.6:8080 local
  10.244.0.7:8080 serving terminating local
  [fd10::5]:8080 ready serving local
`,
		},
		{
			name: "standalone service: target port unset, by number, by name (with its protocol, sidecars too)",
			services: records(store.SourceStatic, service("web", []string{"10.96.0.10"}, []corev1.ServicePort{
				{Name: "plain", Port: 80},
				{Name: "num", Port: 81, TargetPort: intstr.FromInt32(9081)},
				{Name: "named", Port: 82, TargetPort: intstr.FromString("http")},
				{Name: "named-udp", Port: 83, Protocol: udp, TargetPort: intstr.FromString("http")},
				{Name: "sidecar", Port: 84, TargetPort: intstr.FromString("proxy")},
				{Name: "empty-name", Port: 85, TargetPort: intstr.IntOrString{Type: intstr.String}},
			}, selectWeb)),
			pods: []LocalPod{
				withPorts(localPod("a", appWeb, true, "10.244.0.5"),
					corev1.ContainerPort{Name: "http", ContainerPort: 8080, Protocol: tcp},
					corev1.ContainerPort{Name: "http", ContainerPort: 8053, Protocol: udp}),
				withPorts(localPod("b", appWeb, true, "10.244.0.6"), corev1.ContainerPort{Name: "http", ContainerPort: 8081}), // protocol unset is TCP
				func() LocalPod {
					lp := localPod("c", appWeb, true, "10.244.0.7") // no "http" port: not an endpoint of "named"
					lp.Pod.Spec.InitContainers = []corev1.Container{
						{Name: "init", Ports: []corev1.ContainerPort{{Name: "proxy", ContainerPort: 1000}}}, // not a sidecar
						{Name: "proxy", RestartPolicy: ptr(corev1.ContainerRestartPolicyAlways), Ports: []corev1.ContainerPort{{Name: "proxy", ContainerPort: 15001}}},
					}
					return lp
				}(),
			},
			want: `default/web/tcp/empty-name TCP port=85 clusterIPs=10.96.0.10
  10.244.0.5:85 ready serving local
  10.244.0.6:85 ready serving local
  10.244.0.7:85 ready serving local
default/web/tcp/named TCP port=82 clusterIPs=10.96.0.10
  10.244.0.5:8080 ready serving local
  10.244.0.6:8081 ready serving local
default/web/tcp/num TCP port=81 clusterIPs=10.96.0.10
  10.244.0.5:9081 ready serving local
  10.244.0.6:9081 ready serving local
  10.244.0.7:9081 ready serving local
default/web/tcp/plain TCP port=80 clusterIPs=10.96.0.10
  10.244.0.5:80 ready serving local
  10.244.0.6:80 ready serving local
  10.244.0.7:80 ready serving local
default/web/tcp/sidecar TCP port=84 clusterIPs=10.96.0.10
  10.244.0.7:15001 ready serving local
default/web/udp/named-udp UDP port=83 clusterIPs=10.96.0.10
  10.244.0.5:8053 ready serving local
`,
		},
		{
			name:     "standalone service without a selector selects nothing",
			services: records(store.SourceStatic, web()),
			pods:     []LocalPod{localPod("a", appWeb, true, "10.244.0.5")},
			want: `default/web/tcp/80 TCP port=80 clusterIPs=10.96.0.10
`,
		},
		{
			name:     "standalone service over two hostNetwork pods on one port: one endpoint, the ready one",
			services: records(store.SourceStatic, web(selectWeb)),
			pods: []LocalPod{
				hostNetwork(localPod("a", appWeb, false, "192.168.1.10")),
				hostNetwork(localPod("b", appWeb, true, "192.168.1.10")),
			},
			want: `default/web/tcp/80 TCP port=80 clusterIPs=10.96.0.10
  192.168.1.10:80 ready serving local
`,
		},
		{
			name: "headless, ExternalName and unreachable services yield nothing; a node port alone is enough",
			services: fromAPI(
				service("headless", []string{"None"}, []corev1.ServicePort{svcPort("", tcp, 80)}, func(s *corev1.Service) { s.Spec.ClusterIP = "" }),
				service("headless-old", nil, []corev1.ServicePort{svcPort("", tcp, 80)}, func(s *corev1.Service) { s.Spec.ClusterIP = "None" }),
				service("ext", nil, []corev1.ServicePort{svcPort("", tcp, 80)}, func(s *corev1.Service) {
					s.Spec.Type, s.Spec.ExternalName = corev1.ServiceTypeExternalName, "example.com"
				}),
				service("noip", nil, []corev1.ServicePort{svcPort("", tcp, 80)}),
				service("np", nil, []corev1.ServicePort{{Name: "a", Port: 80, NodePort: 30080}, {Name: "b", Port: 81}}, func(s *corev1.Service) {
					s.Spec.Type = corev1.ServiceTypeNodePort
				}),
			),
			want: `default/np/tcp/a TCP port=80 nodePort=30080
`,
		},
		{
			name: "session affinity: default timeout, explicit timeout, none",
			services: fromAPI(
				service("a", []string{"10.96.0.1"}, []corev1.ServicePort{svcPort("", tcp, 80)}, func(s *corev1.Service) {
					s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				}),
				service("b", []string{"10.96.0.2"}, []corev1.ServicePort{svcPort("", tcp, 80)}, func(s *corev1.Service) {
					s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
					s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr[int32](60)}}
				}),
				service("c", []string{"10.96.0.3"}, []corev1.ServicePort{svcPort("", tcp, 80)}, func(s *corev1.Service) {
					s.Spec.SessionAffinity = corev1.ServiceAffinityNone
					s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr[int32](60)}}
				}),
			),
			want: `default/a/tcp/80 TCP port=80 clusterIPs=10.96.0.1 affinity=3h0m0s
default/b/tcp/80 TCP port=80 clusterIPs=10.96.0.2 affinity=1m0s
default/c/tcp/80 TCP port=80 clusterIPs=10.96.0.3
`,
		},
		{
			name: "traffic policies: external Local only where traffic comes from outside",
			services: fromAPI(
				service("internal", []string{"10.96.0.1"}, []corev1.ServicePort{svcPort("", tcp, 80)}, func(s *corev1.Service) {
					s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
					s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal // no externalIPs: meaningless
				}),
				service("cluster", []string{"10.96.0.2"}, []corev1.ServicePort{svcPort("", tcp, 80)}, func(s *corev1.Service) {
					s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyCluster)
				}),
				service("extip", []string{"10.96.0.3"}, []corev1.ServicePort{svcPort("", tcp, 80)}, func(s *corev1.Service) {
					s.Spec.ExternalIPs = []string{"192.0.2.1", "2001:db8::1", "::ffff:192.0.2.1"}
					s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				}),
				service("np", []string{"10.96.0.4"}, []corev1.ServicePort{{Port: 80, NodePort: 30080}}, func(s *corev1.Service) {
					s.Spec.Type = corev1.ServiceTypeNodePort
					s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				}),
				service("lb", []string{"10.96.0.5"}, []corev1.ServicePort{{Port: 80, NodePort: 30081}}, func(s *corev1.Service) {
					s.Spec.Type = corev1.ServiceTypeLoadBalancer
					s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
					s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
						{IP: "203.0.113.7"}, {Hostname: "lb.example.com"},
						{IP: "203.0.113.8", IPMode: ptr(corev1.LoadBalancerIPModeProxy)},
						{IP: "2001:db8::7", IPMode: ptr(corev1.LoadBalancerIPModeVIP)},
					}
				}),
			),
			want: `default/cluster/tcp/80 TCP port=80 clusterIPs=10.96.0.2
default/extip/tcp/80 TCP port=80 clusterIPs=10.96.0.3 externalIPs=192.0.2.1,2001:db8::1 externalLocal
default/internal/tcp/80 TCP port=80 clusterIPs=10.96.0.1 internalLocal
default/lb/tcp/80 TCP port=80 clusterIPs=10.96.0.5 nodePort=30081 lbIPs=203.0.113.7,2001:db8::7
default/np/tcp/80 TCP port=80 clusterIPs=10.96.0.4 nodePort=30080 externalLocal
`,
		},
		{
			name: "sorted by String(), whatever the input order; protocol unset is TCP",
			services: fromAPI(
				service("b", []string{"10.96.0.2"}, []corev1.ServicePort{svcPort("z", udp, 53), {Name: "a", Port: 80}}),
				func() *corev1.Service {
					s := service("z", []string{"10.96.0.3"}, []corev1.ServicePort{svcPort("", tcp, 80)})
					s.Namespace = "a"
					return s
				}(),
			),
			want: `a/z/tcp/80 TCP port=80 clusterIPs=10.96.0.3
default/b/tcp/a TCP port=80 clusterIPs=10.96.0.2
default/b/udp/z UDP port=53 clusterIPs=10.96.0.2
`,
		},
		{
			name: "bad addresses are skipped, the rest of the service built",
			services: fromAPI(service("web", []string{"10.96.0.10", "fd00::zz"}, []corev1.ServicePort{svcPort("", tcp, 80)}, func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"192.0.2.1", "192.0.2.300", "fe80::1%eth0"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "lb"}, {IP: "203.0.113.7"}}
			})),
			want: `default/web/tcp/80 TCP port=80 clusterIPs=10.96.0.10 externalIPs=192.0.2.1 lbIPs=203.0.113.7
`,
			wantErrs: []string{
				`service default/web: spec.clusterIPs[1]: ParseAddr("fd00::zz"): each colon-separated field must have at least one digit (at "zz")`,
				`service default/web: spec.externalIPs[1]: ParseAddr("192.0.2.300"): IPv4 field has value >255`,
				`service default/web: spec.externalIPs[2]: "fe80::1%eth0" has a zone`,
				`service default/web: status.loadBalancer.ingress[0].ip: ParseAddr("lb"): unable to parse IP`,
			},
		},
		{
			name: "a bad clusterIP alone leaves nothing to reach",
			services: fromAPI(service("web", nil, []corev1.ServicePort{svcPort("", tcp, 80)}, func(s *corev1.Service) {
				s.Spec.ClusterIP = "10.96.0.x"
			})),
			wantErrs: []string{`service default/web: spec.clusterIP: ParseAddr("10.96.0.x"): unexpected character (at "x")`},
		},
		{
			name: "bad ports are skipped with the field named, the good one built",
			services: records(store.SourceStatic, service("web", []string{"10.96.0.10"}, []corev1.ServicePort{
				{Name: "zero", Port: 0},
				{Name: "big", Port: 65536},
				{Name: "icmp", Port: 1, Protocol: "ICMP"},
				{Name: "np", Port: 2, NodePort: -1},
				{Name: "tp", Port: 3, TargetPort: intstr.FromInt32(70000)},
				{Name: "ok", Port: 4},
				{Name: "ok", Port: 5},
				{Port: 4},
				{Port: 4},
			}, func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr[int32](0)}}
			})),
			want: `default/web/tcp/4 TCP port=4 clusterIPs=10.96.0.10 affinity=3h0m0s
default/web/tcp/ok TCP port=4 clusterIPs=10.96.0.10 affinity=3h0m0s
`,
			wantErrs: []string{
				`service default/web: spec.sessionAffinityConfig.clientIP.timeoutSeconds: 0 is not from 1 to 86400; using 10800`,
				`service default/web: spec.ports[0].port: 0 is not from 1 to 65535`,
				`service default/web: spec.ports[1].port: 65536 is not from 1 to 65535`,
				`service default/web: spec.ports[2].protocol: "ICMP" is not TCP, UDP or SCTP`,
				`service default/web: spec.ports[3].nodePort: -1 is not from 0 to 65535`,
				`service default/web: spec.ports[4].targetPort: 70000 is not from 1 to 65535`,
				`service default/web: spec.ports[6].name: "ok" is used by another port`,
				`service default/web: spec.ports[8].port: TCP 4 is used by another port`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, errs := Build(Inputs{Node: node, Services: tt.services, Slices: sliceRecords(tt.slices...), LocalPods: tt.pods})
			if d := dump(got); d != tt.want {
				t.Errorf("Build =\n%s\nwant\n%s", d, tt.want)
			}
			var gotErrs []string
			for _, err := range errs {
				gotErrs = append(gotErrs, err.Error())
			}
			if g, w := strings.Join(gotErrs, "\n"), strings.Join(tt.wantErrs, "\n"); g != w {
				t.Errorf("errors =\n%s\nwant\n%s", g, w)
			}
		})
	}
}

// Build's result is what Usable reads: with the API server unreachable
// and the slice stale, traffic follows the local readiness probe.
func TestBuildLocalReadinessDrivesUsable(t *testing.T) {
	s := service("web", []string{"10.96.0.10"}, []corev1.ServicePort{svcPort("", corev1.ProtocolTCP, 80)})
	sl := slice("web-1", "web", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{slicePort("", corev1.ProtocolTCP, 8080)},
		readyEP("10.244.0.5", node), readyEP("10.244.0.6", node), readyEP("10.244.1.5", "pi-2"))
	in := Inputs{Node: node, Services: fromAPI(s), Slices: sliceRecords(sl)}
	usable := func(pods ...LocalPod) string {
		in.LocalPods = pods
		sps, errs := Build(in)
		if len(errs) > 0 || len(sps) != 1 {
			t.Fatalf("Build = %v, %v", sps, errs)
		}
		var addrs []string
		for _, e := range sps[0].Usable(true) {
			addrs = append(addrs, e.Addr.String())
		}
		return strings.Join(addrs, " ")
	}
	if got := usable(localPod("a", nil, true, "10.244.0.5"), localPod("b", nil, true, "10.244.0.6")); got != "10.244.0.5 10.244.0.6" {
		t.Errorf("both ready: local usable %q", got)
	}
	if got := usable(localPod("a", nil, false, "10.244.0.5"), localPod("b", nil, true, "10.244.0.6")); got != "10.244.0.6" {
		t.Errorf("a failing its probe: local usable %q", got)
	}
	if got := usable(deleting(localPod("a", nil, true, "10.244.0.5")), deleting(localPod("b", nil, false, "10.244.0.6"))); got != "10.244.0.5" {
		t.Errorf("both terminating, a still serving: local usable %q", got)
	}
}

// Build does not change what it is given.
func TestBuildLeavesInputsAlone(t *testing.T) {
	lp := localPod("a", map[string]string{"app": "web"}, true, "::ffff:10.244.0.5")
	s := service("web", []string{"10.96.0.10"}, []corev1.ServicePort{{Port: 80}}, func(s *corev1.Service) { s.Spec.Selector = map[string]string{"app": "web"} })
	pods := []LocalPod{lp}
	sps, errs := Build(Inputs{Node: node, Services: records(store.SourceStatic, s), LocalPods: pods})
	if len(errs) > 0 || len(sps) != 1 || len(sps[0].Endpoints) != 1 || sps[0].Endpoints[0].Addr != netip.MustParseAddr("10.244.0.5") {
		t.Fatalf("Build = %s %v", dump(sps), errs)
	}
	if !pods[0].IPs[0].Is4In6() || s.Spec.Ports[0].Protocol != "" {
		t.Fatalf("inputs changed: %v %+v", pods[0].IPs, s.Spec.Ports[0])
	}
}

// TestIndexMatchesBuild: through a random run of changes to Services,
// slices and local pods (readiness, deletion, addresses, a pod taking a
// remote endpoint's address), an Index told only what changed builds what
// Build builds from scratch, and the changes it returns turn what it
// returned before into that.
func TestIndexMatchesBuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ports := []corev1.ServicePort{svcPort("http", corev1.ProtocolTCP, 80)}
	slicePorts := []discoveryv1.EndpointPort{slicePort("http", corev1.ProtocolTCP, 8080)}
	const nsvc = 6
	addr := func(i int) string { return fmt.Sprintf("10.244.%d.%d", i%2, 10+i) } // even i: this node's CIDR
	newSvc := func(i int) *corev1.Service {
		return service(fmt.Sprintf("s%d", i), []string{fmt.Sprintf("10.96.0.%d", 10+i)}, ports, func(s *corev1.Service) {
			if rng.IntN(4) == 0 {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			}
		})
	}
	newSlice := func(i int) *discoveryv1.EndpointSlice {
		var eps []discoveryv1.Endpoint
		for j := range 1 + rng.IntN(3) {
			a := rng.IntN(12)
			nodeName := "pi-2"
			if a%2 == 0 {
				nodeName = node
			}
			e := ep(addr(a), nodeName, ptr(rng.IntN(3) > 0), nil, nil)
			if j == 0 && rng.IntN(2) == 0 {
				e = withRef(e, fmt.Sprintf("uid-p%d", a))
			}
			eps = append(eps, e)
		}
		return slice(fmt.Sprintf("s%d-x", i), fmt.Sprintf("s%d", i), discoveryv1.AddressTypeIPv4, slicePorts, eps...)
	}
	svcs := make([]*corev1.Service, nsvc)
	sls := make([]*discoveryv1.EndpointSlice, nsvc)
	for i := range nsvc {
		svcs[i], sls[i] = newSvc(i), newSlice(i)
	}
	standalone := service("picked", []string{"10.96.1.1"}, ports, func(s *corev1.Service) { s.Spec.Selector = map[string]string{"app": "web"} })
	pods := map[int]LocalPod{} // by address index
	for _, a := range []int{0, 2, 4} {
		pods[a] = localPod(fmt.Sprintf("p%d", a), map[string]string{"app": "web"}, true, addr(a))
	}
	x := NewIndex(node)
	applied := map[string]ServicePort{}
	var last Inputs
	for step := range 400 {
		switch k := rng.IntN(7); {
		case k == 0:
			i := rng.IntN(nsvc)
			svcs[i] = newSvc(i)
		case k == 1:
			i := rng.IntN(nsvc)
			sls[i] = newSlice(i)
		case k == 2 && len(pods) > 0, k == 3 && len(pods) > 0:
			for a, lp := range pods {
				switch {
				case k == 2:
					lp.Ready = !lp.Ready
				case rng.IntN(2) == 0:
					lp = deleting(localPod(lp.Pod.Name, lp.Pod.Labels, lp.Ready, addr(a)))
				default:
					delete(pods, a)
					continue
				}
				pods[a] = lp
				break
			}
		case k == 4:
			// A pod of this node, maybe at an address a slice calls
			// another node's.
			a := rng.IntN(12)
			pods[a] = localPod(fmt.Sprintf("p%d", a), map[string]string{"app": "web"}, rng.IntN(2) == 0, addr(a))
		case k == 5:
			i := rng.IntN(nsvc)
			svcs[i], sls[i] = nil, nil
		default:
			// Nothing changed.
		}
		in := Inputs{Node: node}
		for i := range nsvc {
			if svcs[i] == nil {
				svcs[i], sls[i] = newSvc(i), newSlice(i) // back next time
				continue
			}
			in.Services = append(in.Services, fromAPI(svcs[i])...)
			in.Slices = append(in.Slices, sliceRecords(sls[i])...)
		}
		in.Services = append(in.Services, records(store.SourceStatic, standalone)...)
		for a := range 12 {
			if lp, ok := pods[a]; ok {
				in.LocalPods = append(in.LocalPods, lp)
			}
		}
		feedIndex(x, last, in)
		last = in
		changes, _ := buildIndex(x, in)
		for _, c := range changes {
			if c.Port == nil {
				delete(applied, c.Key)
			} else {
				applied[c.Key] = *c.Port
			}
		}
		got := x.Ports()
		want, _ := Build(in)
		if dump(got) != dump(want) {
			t.Fatalf("step %d: Index:\n%sBuild:\n%s", step, dump(got), dump(want))
		}
		var fromChanges []ServicePort
		for _, k := range slices.Sorted(maps.Keys(applied)) {
			fromChanges = append(fromChanges, applied[k])
		}
		if dump(fromChanges) != dump(want) {
			t.Fatalf("step %d: the changes add up to:\n%sBuild:\n%s", step, dump(fromChanges), dump(want))
		}
		if x.Len() != len(want) {
			t.Fatalf("step %d: Len = %d, want %d", step, x.Len(), len(want))
		}
	}
}

// feedIndex tells x what changed from prev to cur, as the proxy does from
// the store's Feed: the records whose object is another one.
func feedIndex(x *Index, prev, cur Inputs) {
	svcs := map[string]*corev1.Service{}
	for _, r := range cur.Services {
		k := store.Key(r.Object.Namespace, r.Object.Name)
		svcs[k] = r.Object
		if !slices.ContainsFunc(prev.Services, func(p store.Record[*corev1.Service]) bool { return p.Object == r.Object }) {
			x.ServiceChanged(k, true)
		}
	}
	for _, r := range prev.Services {
		if k := store.Key(r.Object.Namespace, r.Object.Name); svcs[k] == nil {
			x.ServiceChanged(k, false)
		}
	}
	sls := map[string]*discoveryv1.EndpointSlice{}
	for _, r := range cur.Slices {
		k := store.Key(r.Object.Namespace, r.Object.Name)
		sls[k] = r.Object
		if !slices.ContainsFunc(prev.Slices, func(p store.Record[*discoveryv1.EndpointSlice]) bool { return p.Object == r.Object }) {
			x.SliceChanged(k, SliceOwner(r.Object))
		}
	}
	for _, r := range prev.Slices {
		if k := store.Key(r.Object.Namespace, r.Object.Name); sls[k] == nil {
			x.SliceChanged(k, "")
		}
	}
}

// buildIndex runs x's Pending and Build on the objects of in, giving
// Build only those Pending named.
func buildIndex(x *Index, in Inputs) ([]PortChange, []error) {
	svcKeys, sliceKeys := x.Pending(in.LocalPods)
	objs := Objects{Services: map[string]store.Record[*corev1.Service]{}, Slices: map[string]store.Record[*discoveryv1.EndpointSlice]{}}
	for _, r := range in.Services {
		if k := store.Key(r.Object.Namespace, r.Object.Name); slices.Contains(svcKeys, k) {
			objs.Services[k] = r
		}
	}
	for _, r := range in.Slices {
		if k := store.Key(r.Object.Namespace, r.Object.Name); slices.Contains(sliceKeys, k) {
			objs.Slices[k] = r
		}
	}
	return x.Build(objs)
}

// TestIndexBuildsOnlyWhatChanged: an Index builds a Service again only
// when something it depends on changed.
func TestIndexBuildsOnlyWhatChanged(t *testing.T) {
	ports := []corev1.ServicePort{svcPort("", corev1.ProtocolTCP, 80)}
	slicePorts := []discoveryv1.EndpointPort{slicePort("", corev1.ProtocolTCP, 8080)}
	remote := service("remote", []string{"10.96.0.10"}, ports)
	remoteSl := slice("remote-1", "remote", discoveryv1.AddressTypeIPv4, slicePorts, readyEP("10.244.1.5", "pi-2"))
	local := service("local", []string{"10.96.0.11"}, ports)
	localSl := slice("local-1", "local", discoveryv1.AddressTypeIPv4, slicePorts, readyEP("10.244.0.5", node))
	in := Inputs{Node: node, Services: fromAPI(local, remote), Slices: sliceRecords(localSl, remoteSl),
		LocalPods: []LocalPod{localPod("a", nil, true, "10.244.0.5")}}
	x := NewIndex(node)
	feedIndex(x, Inputs{}, in)
	first, _ := buildIndex(x, in)
	if len(first) != 2 || first[0].Port == nil || first[0].Port.Name != "local" || first[1].Port == nil || first[1].Port.Name != "remote" {
		t.Fatalf("first Build = %+v", first)
	}
	in.LocalPods[0].Ready = false
	if svcs, sls := x.Pending(in.LocalPods); !slices.Equal(svcs, []string{"default/local"}) || !slices.Equal(sls, []string{"default/local-1"}) {
		t.Fatalf("after a local pod's readiness changed, Pending = %q, %q; want default/local and its slice only", svcs, sls)
	}
	second, _ := buildIndex(x, in)
	if len(second) != 1 || second[0].Port == nil || second[0].Port.Name != "local" {
		t.Fatalf("after a local pod's readiness changed, Build = %+v, want local only", second)
	}
	if second[0].Port.Endpoints[0].Ready {
		t.Errorf("local: its pod's readiness went, the endpoint is still ready")
	}
	prev := in
	in.Slices = sliceRecords(localSl, slice("remote-1", "remote", discoveryv1.AddressTypeIPv4, slicePorts, readyEP("10.244.1.6", "pi-2")))
	feedIndex(x, prev, in)
	third, _ := buildIndex(x, in)
	if len(third) != 2 || third[1].Port == nil || third[1].Port.Endpoints[0].Addr.String() != "10.244.1.6" {
		t.Errorf("after remote's slice changed to 10.244.1.6, Build = %+v", third)
	}
	prev = in
	in.Services = fromAPI(local)
	feedIndex(x, prev, in)
	fourth, _ := buildIndex(x, in)
	if len(fourth) != 2 || fourth[1].Key != "default/remote/tcp/80" || fourth[1].Port != nil {
		t.Errorf("after remote was deleted, Build = %+v", fourth)
	}
	if got := x.Ports(); len(got) != 1 || got[0].Name != "local" {
		t.Errorf("Ports = %s", dump(got))
	}
}
