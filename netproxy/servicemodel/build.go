package servicemodel

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/outpost-edge/outpost/store"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// DefaultAffinityTimeout is the ClientIP session affinity timeout of a
// Service that sets none (the API server's default, 3 hours).
const DefaultAffinityTimeout = time.Duration(corev1.DefaultClientIPServiceAffinitySeconds) * time.Second

// maxAffinitySeconds is the largest timeout the API server accepts.
const maxAffinitySeconds = 86400

// Inputs is what Build reads.
type Inputs struct {
	// Node is this node's name: slice endpoints with this nodeName are
	// local.
	Node string
	// Services are the stored Services (st.Services().List()).
	Services []store.Record[*corev1.Service]
	// Slices are the stored EndpointSlices (st.EndpointSlices().List()).
	Slices []store.Record[*discoveryv1.EndpointSlice]
	// LocalPods are this node's pods as the agent sees them now.
	LocalPods []LocalPod
}

// LocalPod is a pod running on this node with its current readiness.
type LocalPod struct {
	// Pod is the desired pod: spec, labels, namespace, UID and
	// deletionTimestamp are read.
	Pod *corev1.Pod
	// IPs are its addresses; a pod with none yet is not an endpoint. A
	// hostNetwork pod's are the node's.
	IPs []netip.Addr
	// Ready is the agent's current PodReady condition.
	Ready bool
}

// conditions returns the endpoint conditions of the pod as the agent sees
// it: ready when the pod is ready and not being deleted, serving when it
// is ready, terminating when it is being deleted.
func (p *LocalPod) conditions() (ready, serving, terminating bool) {
	terminating = p.Pod.DeletionTimestamp != nil
	return p.Ready && !terminating, p.Ready, terminating
}

// Build returns the service ports the proxy programs for what the store
// holds, sorted by String(), and one error per Service, port or address
// it skipped, naming the object and field (the rest of that Service is
// still built).
//
// Headless and ExternalName Services yield nothing, nor does a port with
// neither a cluster IP nor a node port. The endpoints of a Service from
// the API server, or from MQTT (the bridge publishes the API's Services
// with their EndpointSlices), are those of its EndpointSlices; those of a
// standalone Service (from a manifest) are the local pods its selector
// matches. Either way, an endpoint that is a local pod has the
// conditions the agent sees now, not those of a possibly stale slice.
func Build(in Inputs) ([]ServicePort, []error) {
	pods := newPodIndex(in.LocalPods)
	slicesOf := indexSlices(in.Slices)
	// Most Services have one port.
	out := make([]ServicePort, 0, len(in.Services))
	names := make([]string, 0, len(in.Services))
	var errs []error
	for _, rec := range in.Services {
		if rec.Object == nil {
			continue
		}
		b := newBuilder(in.Node, pods, rec)
		if !b.standalone {
			b.slices = slicesOf[b.key]
		}
		for _, sp := range b.build() {
			out, names = append(out, sp), append(names, sp.String())
		}
		errs = append(errs, b.errs...)
	}
	return sortPorts(out, names), errs
}

// sortPorts sorts ports by their String(), names[i] being ports[i]'s,
// each computed once. The store lists Services by namespace and name, so
// they often are already.
func sortPorts(ports []ServicePort, names []string) []ServicePort {
	if slices.IsSorted(names) {
		return ports
	}
	order := make([]int, len(ports))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(names[a], names[b]) })
	sorted := make([]ServicePort, len(ports))
	for i, j := range order {
		sorted[i] = ports[j]
	}
	return sorted
}

// indexSlices groups the EndpointSlices by the Service they belong to
// (namespace and kubernetes.io/service-name label), each group sorted
// by slice name so that duplicates resolve the same way every time.
func indexSlices(recs []store.Record[*discoveryv1.EndpointSlice]) map[string][]*discoveryv1.EndpointSlice {
	bySvc := make(map[string][]*discoveryv1.EndpointSlice, len(recs))
	for _, r := range recs {
		s := r.Object
		if s == nil {
			continue
		}
		name := s.Labels[discoveryv1.LabelServiceName]
		if name == "" {
			continue
		}
		key := store.Key(s.Namespace, name)
		bySvc[key] = append(bySvc[key], s)
	}
	for _, group := range bySvc {
		slices.SortFunc(group, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	}
	return bySvc
}

// newBuilder returns the builder of the Service rec on node; the caller
// sets the slices of one from the API server or MQTT.
func newBuilder(node string, pods *podIndex, rec store.Record[*corev1.Service]) builder {
	svc := rec.Object
	return builder{node: node, pods: pods, svc: svc, key: store.Key(svc.Namespace, svc.Name),
		standalone: rec.Source != store.SourceAPI && rec.Source != store.SourceMQTT}
}

// builder builds the ports of one Service.
type builder struct {
	node       string
	pods       *podIndex
	svc        *corev1.Service
	key        string // namespace/name
	standalone bool
	slices     []*discoveryv1.EndpointSlice
	errs       []error
	// local is set once an endpoint turned out to be a local pod: what
	// was built then depends on that pod's readiness.
	local bool
}

func (b *builder) fail(field, format string, args ...any) {
	b.errs = append(b.errs, fmt.Errorf("service %s: %s: %s", b.key, field, fmt.Sprintf(format, args...)))
}

func (b *builder) failErr(field string, err error) {
	b.errs = append(b.errs, fmt.Errorf("service %s: %s: %w", b.key, field, err))
}

func (b *builder) build() []ServicePort {
	spec := &b.svc.Spec
	if spec.Type == corev1.ServiceTypeExternalName || spec.ClusterIP == corev1.ClusterIPNone ||
		(len(spec.ClusterIPs) > 0 && spec.ClusterIPs[0] == corev1.ClusterIPNone) {
		return nil
	}
	base := ServicePort{
		Namespace:     b.svc.Namespace,
		Name:          b.svc.Name,
		InternalLocal: spec.InternalTrafficPolicy != nil && *spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal,
		ExternalLocal: externallyReachable(spec) && spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal,
	}
	if len(spec.ClusterIPs) > 0 {
		for i, s := range spec.ClusterIPs {
			base.ClusterIPs = b.addAddr(base.ClusterIPs, fmt.Sprintf("spec.clusterIPs[%d]", i), s)
		}
	} else if spec.ClusterIP != "" {
		base.ClusterIPs = b.addAddr(base.ClusterIPs, "spec.clusterIP", spec.ClusterIP)
	}
	for i, s := range spec.ExternalIPs {
		base.ExternalIPs = b.addAddr(base.ExternalIPs, fmt.Sprintf("spec.externalIPs[%d]", i), s)
	}
	for i, ing := range b.svc.Status.LoadBalancer.Ingress {
		// A hostname-only ingress has no address to program, and a
		// "Proxy" one delivers to the node port, not to its IP (as in
		// kube-proxy).
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode != corev1.LoadBalancerIPModeVIP) {
			continue
		}
		base.LoadBalancerIPs = b.addAddr(base.LoadBalancerIPs, fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i), ing.IP)
	}
	if spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		base.AffinityTimeout = DefaultAffinityTimeout
		if c := spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			if t := *c.ClientIP.TimeoutSeconds; t < 1 || t > maxAffinitySeconds {
				b.fail("spec.sessionAffinityConfig.clientIP.timeoutSeconds", "%d is not from 1 to %d; using %d", t, maxAffinitySeconds, corev1.DefaultClientIPServiceAffinitySeconds)
			} else {
				base.AffinityTimeout = time.Duration(t) * time.Second
			}
		}
	}

	var out []ServicePort
	seen := map[string]bool{}
	for i := range spec.Ports {
		sp, ok := b.port(base, i)
		if !ok {
			continue
		}
		id := sp.String()
		if seen[id] {
			if sp.PortName != "" {
				b.fail(fmt.Sprintf("spec.ports[%d].name", i), "%q is used by another port", sp.PortName)
			} else {
				b.fail(fmt.Sprintf("spec.ports[%d].port", i), "%s %d is used by another port", sp.Protocol, sp.Port)
			}
			continue
		}
		seen[id] = true
		if len(sp.ClusterIPs) == 0 && sp.NodePort == 0 {
			continue
		}
		out = append(out, sp)
	}
	return out
}

// externallyReachable reports whether a Service takes traffic from
// outside the cluster: through node ports, a load balancer or external
// IPs. Only then does its externalTrafficPolicy apply.
func externallyReachable(spec *corev1.ServiceSpec) bool {
	return spec.Type == corev1.ServiceTypeNodePort || spec.Type == corev1.ServiceTypeLoadBalancer || len(spec.ExternalIPs) > 0
}

// addAddr parses the address s of field and appends it to addrs, or
// reports why it cannot.
func (b *builder) addAddr(addrs []netip.Addr, field, s string) []netip.Addr {
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		b.failErr(field, err)
		return addrs
	case a.Zone() != "":
		b.fail(field, "%q has a zone", s)
		return addrs
	}
	// "::ffff:192.0.2.1" is 192.0.2.1, as in the nft renderer.
	if a = a.Unmap(); slices.Contains(addrs, a) {
		return addrs
	}
	return append(addrs, a)
}

// port builds port i of the Service from base, or reports why it cannot.
func (b *builder) port(base ServicePort, i int) (ServicePort, bool) {
	p := &b.svc.Spec.Ports[i]
	field := fmt.Sprintf("spec.ports[%d]", i)
	ok := true
	if p.Port < 1 || p.Port > 65535 {
		b.fail(field+".port", "%d is not from 1 to 65535", p.Port)
		ok = false
	}
	proto := protocol(p.Protocol)
	switch proto {
	case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
	default:
		b.fail(field+".protocol", "%q is not TCP, UDP or SCTP", p.Protocol)
		ok = false
	}
	if p.NodePort < 0 || p.NodePort > 65535 {
		b.fail(field+".nodePort", "%d is not from 0 to 65535", p.NodePort)
		ok = false
	}
	if b.standalone && p.TargetPort.Type == intstr.Int && (p.TargetPort.IntVal < 0 || p.TargetPort.IntVal > 65535) {
		b.fail(field+".targetPort", "%d is not from 1 to 65535", p.TargetPort.IntVal)
		ok = false
	}
	if !ok {
		return ServicePort{}, false
	}
	sp := base
	// Each port has its own copies: a caller may change one port's.
	sp.ClusterIPs = slices.Clone(base.ClusterIPs)
	sp.ExternalIPs = slices.Clone(base.ExternalIPs)
	sp.LoadBalancerIPs = slices.Clone(base.LoadBalancerIPs)
	sp.PortName = p.Name
	sp.Protocol = string(proto)
	sp.Port = uint16(p.Port)
	sp.NodePort = uint16(p.NodePort)
	eps := endpointSet{}
	if b.standalone {
		b.selectPods(eps, p, proto)
	} else {
		b.sliceEndpoints(eps, p.Name, proto)
	}
	sp.Endpoints = eps.sorted()
	return sp, true
}

// protocol defaults an unset protocol to TCP.
func protocol(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// sliceEndpoints adds the endpoints of the Service's slices for the
// service port of that name and protocol.
func (b *builder) sliceEndpoints(eps endpointSet, name string, proto corev1.Protocol) {
	for _, s := range b.slices {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue // FQDN: nothing to program
		}
		for _, sp := range s.Ports {
			if ptrOr(sp.Name, "") != name || protocol(ptrOr(sp.Protocol, "")) != proto {
				continue
			}
			port := ptrOr(sp.Port, 0)
			if port < 1 || port > 65535 {
				continue
			}
			for i := range s.Endpoints {
				if e, ok := b.sliceEndpoint(s.Namespace, &s.Endpoints[i], uint16(port), proto); ok {
					eps.add(e)
				}
			}
		}
	}
}

// sliceEndpoint is one slice endpoint at port, with the conditions of
// the local pod it is, if any.
func (b *builder) sliceEndpoint(ns string, se *discoveryv1.Endpoint, port uint16, proto corev1.Protocol) (Endpoint, bool) {
	if len(se.Addresses) == 0 {
		return Endpoint{}, false
	}
	// As kube-proxy: the addresses are fungible, the first one is used.
	addr, err := netip.ParseAddr(se.Addresses[0])
	if err != nil || addr.Zone() != "" {
		return Endpoint{}, false
	}
	addr = addr.Unmap()
	c := se.Conditions
	e := Endpoint{
		Addr:        addr,
		Port:        port,
		Ready:       c.Ready == nil || *c.Ready,
		Terminating: c.Terminating != nil && *c.Terminating,
		Local:       b.node != "" && se.NodeName != nil && *se.NodeName == b.node,
	}
	e.Serving = e.Ready
	if c.Serving != nil {
		e.Serving = *c.Serving
	}
	var uid types.UID
	if se.TargetRef != nil {
		uid = se.TargetRef.UID
	}
	if lp, has := b.pods.owner(uid, addr, ns, port, proto); lp != nil {
		b.local = true
		e.Ready, e.Serving, e.Terminating = lp.conditions()
		if has {
			e.Local = true
		} else {
			// The pod the slice names is here but no longer has this
			// address: nothing answers on it.
			e.Ready, e.Serving = false, false
		}
	}
	return e, true
}

// selectPods adds, for a standalone Service, an endpoint per address of
// each local pod its selector matches, at the pod's target port.
func (b *builder) selectPods(eps endpointSet, p *corev1.ServicePort, proto corev1.Protocol) {
	sel := b.svc.Spec.Selector
	if len(sel) == 0 {
		return
	}
	for _, lp := range b.pods.all {
		pod := lp.Pod
		if pod.Namespace != b.svc.Namespace || len(lp.IPs) == 0 || !matches(sel, pod.Labels) {
			continue
		}
		port, ok := targetPort(p, proto, pod)
		if !ok {
			continue
		}
		ready, serving, terminating := lp.conditions()
		for _, a := range lp.IPs {
			eps.add(Endpoint{Addr: a, Port: port, Ready: ready, Serving: serving, Terminating: terminating, Local: true})
		}
	}
}

// matches reports whether labels have every key and value of sel.
func matches(sel, labels map[string]string) bool {
	for k, v := range sel {
		if lv, ok := labels[k]; !ok || lv != v {
			return false
		}
	}
	return true
}

// targetPort resolves a service port's targetPort on pod, as the
// EndpointSlice controller does: a number is that port, a name is the
// pod's container port of that name and protocol (also of sidecar init
// containers), none is the service port.
func targetPort(p *corev1.ServicePort, proto corev1.Protocol, pod *corev1.Pod) (uint16, bool) {
	tp := p.TargetPort
	switch {
	case tp.Type == intstr.Int && tp.IntVal != 0:
		return uint16(tp.IntVal), true
	case tp.Type != intstr.String || tp.StrVal == "":
		return uint16(p.Port), true
	}
	find := func(cs []corev1.Container, sidecarsOnly bool) (uint16, bool) {
		for i := range cs {
			c := &cs[i]
			if sidecarsOnly && (c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways) {
				continue
			}
			for _, cp := range c.Ports {
				if cp.Name == tp.StrVal && protocol(cp.Protocol) == proto && cp.ContainerPort >= 1 && cp.ContainerPort <= 65535 {
					return uint16(cp.ContainerPort), true
				}
			}
		}
		return 0, false
	}
	if port, ok := find(pod.Spec.Containers, false); ok {
		return port, true
	}
	return find(pod.Spec.InitContainers, true)
}

// hasContainerPort reports whether a container of pod declares port with
// protocol (as a hostNetwork pod's container port is its host port).
func hasContainerPort(pod *corev1.Pod, port uint16, proto corev1.Protocol) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for _, c := range cs {
			for _, cp := range c.Ports {
				if cp.ContainerPort == int32(port) && protocol(cp.Protocol) == proto {
					return true
				}
			}
		}
	}
	return false
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// podIndex finds the local pod an endpoint is.
type podIndex struct {
	all   []*LocalPod
	byUID map[types.UID]*LocalPod
	byIP  map[netip.Addr][]*LocalPod
}

func newPodIndex(pods []LocalPod) *podIndex {
	ix := &podIndex{byUID: map[types.UID]*LocalPod{}, byIP: map[netip.Addr][]*LocalPod{}}
	for _, p := range pods {
		if p.Pod == nil {
			continue
		}
		// A copy with the valid addresses, IPv4 ones unmapped.
		lp := &LocalPod{Pod: p.Pod, Ready: p.Ready}
		for _, a := range p.IPs {
			if a = a.Unmap(); a.IsValid() && !slices.Contains(lp.IPs, a) {
				lp.IPs = append(lp.IPs, a)
			}
		}
		ix.all = append(ix.all, lp)
		if lp.Pod.UID != "" {
			ix.byUID[lp.Pod.UID] = lp
		}
		for _, a := range lp.IPs {
			ix.byIP[a] = append(ix.byIP[a], lp)
		}
	}
	return ix
}

// key identifies the pods and their addresses, leaving out what may
// change without changing which endpoint is which pod (readiness,
// deletion): BuildCache starts over when it changes.
func (ix *podIndex) key() string {
	ids := make([]string, 0, len(ix.all))
	for _, lp := range ix.all {
		id := string(lp.Pod.UID) + "\x00" + lp.Pod.Namespace + "\x00" + lp.Pod.Name
		for _, a := range lp.IPs {
			id += "\x00" + a.String()
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return strings.Join(ids, "\x01")
}

// owner returns the local pod a slice endpoint of namespace ns is, and
// whether addr is one of that pod's addresses: the pod its targetRef
// names, else the pod with that address. Several pods share the node's
// address (hostNetwork pods); then the one of namespace ns with a
// container port port is taken, and none when that is not exactly one.
// It returns nil when the endpoint is no local pod: a slice may name a
// pod of this node that the agent does not know yet.
func (ix *podIndex) owner(uid types.UID, addr netip.Addr, ns string, port uint16, proto corev1.Protocol) (*LocalPod, bool) {
	if lp, ok := ix.byUID[uid]; ok {
		return lp, slices.Contains(lp.IPs, addr)
	}
	cands := ix.byIP[addr]
	if len(cands) == 1 {
		return cands[0], true
	}
	var found *LocalPod
	for _, lp := range cands {
		if lp.Pod.Namespace == ns && hasContainerPort(lp.Pod, port, proto) {
			if found != nil {
				return nil, false
			}
			found = lp
		}
	}
	return found, found != nil
}

// endpointSet holds endpoints by address and port; of two with the same,
// the ready one is kept, then the serving one, then the local one, then
// the first.
type endpointSet map[netip.AddrPort]Endpoint

func (s endpointSet) add(e Endpoint) {
	k := netip.AddrPortFrom(e.Addr, e.Port)
	if old, ok := s[k]; ok && rank(old) >= rank(e) {
		return
	}
	s[k] = e
}

func rank(e Endpoint) int {
	r := 0
	if e.Ready {
		r += 4
	}
	if e.Serving {
		r += 2
	}
	if e.Local {
		r++
	}
	return r
}

// sorted returns the endpoints by address, then port.
func (s endpointSet) sorted() []Endpoint {
	if len(s) == 0 {
		return nil
	}
	out := make([]Endpoint, 0, len(s))
	for _, e := range s {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Endpoint) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
	})
	return out
}
