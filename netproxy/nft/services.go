package nft

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"strconv"
	"strings"

	"github.com/outpost-edge/outpost/netproxy/servicemodel"
)

// nameBaseMax is the longest "HASH-readable" part of a per-ServicePort
// name: the kernel takes 255 bytes, and the longest prefix is 9.
const nameBaseMax = 240

// hashName returns "HASH-readable", HASH being the first 8 characters of
// base32(sha256(readable)): unique even when a long name is cut, and
// different at a glance for names that differ in one digit.
func hashName(readable string) string {
	sum := sha256.Sum256([]byte(readable))
	var enc [56]byte
	base32.StdEncoding.Encode(enc[:], sum[:])
	name := string(enc[:8]) + "-" + readable
	if len(name) > nameBaseMax {
		name = name[:nameBaseMax-3] + "..."
	}
	return name
}

// endpointReadable returns "ns/svc/proto/port__ip/port", with an IPv6
// address's colons as dots (nft does not take colons in names).
func endpointReadable(key string, e servicemodel.Endpoint) string {
	ip := e.Addr.Unmap().String()
	if strings.Contains(ip, ":") {
		ip = strings.ReplaceAll(ip, ":", ".")
	}
	return key + "__" + ip + "/" + strconv.Itoa(int(e.Port))
}

// renderService appends to o what one ServicePort wants, after kube-proxy.
// A ServicePort the shared rules can DNAT (maxGroup) wants only elements
// (renderGrouped); any other:
//
//   - service-…: the cluster-wide policy chain. It has affinity rules
//     (`ip saddr @affinity-… goto endpoint-…`) and, per family with
//     endpoints, a numgen cascade over the usable endpoints of that
//     family (see MatchRandom): `meta nfproto ipvX numgen random mod k 0
//     meta l4proto <proto> dnat to <ip>:<port>`, …, or with affinity
//     `… goto endpoint-…`.
//   - local-…: the same over this node's usable endpoints, when
//     internalTrafficPolicy or externalTrafficPolicy is Local.
//   - The chain ClusterIPs go to (service-…, or local-… for
//     internalTrafficPolicy Local) starts with `ip daddr <clusterIP> ip
//     saddr != <podCIDR> jump mark-for-masquerade` per ClusterIP (for the
//     family without a pod CIDR, every source).
//   - external-…, for a NodePort, external IPs or load-balancer IPs: with
//     externalTrafficPolicy Cluster it marks for masquerade and goes to
//     service-…; with Local, pods and the node itself short-circuit to
//     service-… (the node masqueraded) and the rest goes to local-…
//     unmasqueraded, so endpoints see the client's address.
//   - endpoint-…__ip/port, with affinity only: `update @affinity-… {
//     ip saddr }`, `meta l4proto <proto> dnat to <ip>:<port>`.
//   - affinity-…__ip/port sets, with the affinity timeout.
//   - objects.hairpin: every endpoint the chains go to, whose `ip . ip`
//     element of hairpin-endpoints(6) masquerades a pod that reached
//     itself. An element per endpoint, not a rule: fewer objects for the
//     kernel to check at every commit.
//   - Map elements, per address family: a ClusterIP goes to its chain in
//     service-ips(6) when it has endpoints for its traffic policy, else
//     into no-endpoint-services(6) as drop (there are endpoints, just none
//     for the policy) or goto reject-chain (none at all); external and
//     load-balancer IPs, and the NodePort in the nodeport maps, go to
//     external-… when there are endpoints at all, and into the
//     no-endpoint maps by the same rule for the external policy.
//
// With internalTrafficPolicy Local the ClusterIPs go to local-…, not
// service-…, so that NodePort traffic of a Service whose external policy
// is Cluster still reaches every endpoint.
//
// A ServicePort with neither ClusterIPs nor external addresses wants
// nothing.
func renderService(key string, sp *servicemodel.ServicePort, podCIDR netip.Prefix, o *objects) {
	external := sp.NodePort != 0 || len(sp.ExternalIPs) > 0 || len(sp.LoadBalancerIPs) > 0
	if len(sp.ClusterIPs) == 0 && !external {
		return
	}
	r := svcRender{
		key:     key,
		sp:      sp,
		podCIDR: podCIDR,
		proto:   canonicalProtocol(sp.Protocol),
		base:    hashName(key),
		names:   make([]string, len(sp.Endpoints)),
	}
	cluster := indexes(sp.Endpoints, sp.Usable(false))
	// A NodePort and external addresses under the Cluster policy need no
	// chain either.
	if (!external || !sp.ExternalLocal) && sp.AffinityTimeout <= 0 && !sp.InternalLocal && r.fitsGroup(cluster) {
		r.renderGrouped(cluster, o)
		return
	}
	local := indexes(sp.Endpoints, sp.Usable(true))
	useCluster := len(cluster) > 0 && (!sp.InternalLocal || external)
	useLocal := len(local) > 0 && (sp.InternalLocal || sp.ExternalLocal && external)
	useExternal := len(cluster) > 0 && external

	serviceChain := prefixService + r.base
	localChain := prefixLocal + r.base
	externalChain := prefixExternal + r.base
	internalChain, internal := serviceChain, cluster
	if sp.InternalLocal {
		internalChain, internal = localChain, local
	}
	externalEps := cluster
	if sp.ExternalLocal {
		externalEps = local
	}

	if useCluster {
		o.chains = append(o.chains, r.policyChain(serviceChain, cluster, !sp.InternalLocal))
	}
	if useLocal {
		o.chains = append(o.chains, r.policyChain(localChain, local, sp.InternalLocal))
	}
	if useExternal {
		o.chains = append(o.chains, r.externalChain(externalChain, serviceChain, localChain, len(local) > 0))
	}
	// Every endpoint a policy chain goes to, in the ServicePort's order,
	// has a hairpin element; with affinity, also an endpoint chain and an
	// affinity set.
	used := make([]bool, len(sp.Endpoints))
	if useCluster {
		for _, i := range cluster {
			used[i] = true
		}
	}
	if useLocal {
		for _, i := range local {
			used[i] = true
		}
	}
	for i, u := range used {
		if !u {
			continue
		}
		o.hairpin = append(o.hairpin, r.addr(i))
		if sp.AffinityTimeout <= 0 {
			continue
		}
		o.chains = append(o.chains, r.endpointChain(i))
		o.sets = append(o.sets, AddrSet{Name: r.affinitySet(i), V6: r.is6(i), Timeout: sp.AffinityTimeout})
	}

	// Map elements, each key once (the first wins).
	n0 := len(o.elems)
	add := func(m mapID, k MapKey, v Verdict) { o.addElem(n0, elem{key: elemID{m: m, k: k}, v: v}) }
	noEndpoints := func(some bool) Verdict {
		if some {
			return Verdict{Kind: VerdictDrop}
		}
		return Goto(chainReject)
	}
	for _, ip := range sp.ClusterIPs {
		ip = ip.Unmap()
		v6 := ip.Is6()
		k := MapKey{Addr: ip, Protocol: r.proto, Port: sp.Port}
		if r.hasFamily(internal, v6) {
			add(pick(v6, mapServiceIPs, mapServiceIPs6), k, Goto(internalChain))
		} else {
			add(pick(v6, mapNoEndpointServices, mapNoEndpointServices6), k, noEndpoints(r.hasFamily(cluster, v6)))
		}
	}
	for _, ips := range [][]netip.Addr{sp.ExternalIPs, sp.LoadBalancerIPs} {
		for _, ip := range ips {
			ip = ip.Unmap()
			v6 := ip.Is6()
			k := MapKey{Addr: ip, Protocol: r.proto, Port: sp.Port}
			some := r.hasFamily(cluster, v6)
			if some {
				add(pick(v6, mapServiceIPs, mapServiceIPs6), k, Goto(externalChain))
			}
			if !r.hasFamily(externalEps, v6) {
				add(pick(v6, mapNoEndpointServices, mapNoEndpointServices6), k, noEndpoints(some))
			}
		}
	}
	if sp.NodePort != 0 {
		k := MapKey{Protocol: r.proto, Port: sp.NodePort}
		if len(cluster) > 0 {
			add(mapServiceNodePorts, k, Goto(externalChain))
		}
		if len(externalEps) == 0 {
			add(mapNoEndpointNodePorts, k, noEndpoints(len(cluster) > 0))
		}
	}
}

func pick(v6 bool, v4map, v6map mapID) mapID {
	if v6 {
		return v6map
	}
	return v4map
}

// indexes returns the positions in all of sub, a subsequence of all (as
// ServicePort.Usable returns).
func indexes(all, sub []servicemodel.Endpoint) []int {
	idx := make([]int, 0, len(sub))
	j := 0
	for _, e := range sub {
		for j < len(all) && all[j] != e {
			j++
		}
		if j == len(all) {
			break
		}
		idx = append(idx, j)
		j++
	}
	return idx
}

// fitsGroup reports whether the endpoints idx hold at most maxGroup of
// each family.
func (r *svcRender) fitsGroup(idx []int) bool {
	n6 := 0
	for _, i := range idx {
		if r.is6(i) {
			n6++
		}
	}
	return n6 <= maxGroup && len(idx)-n6 <= maxGroup
}

// addElem appends e to o's elements unless one of those from n0 on (one
// ServicePort's) has its key already: the first wins.
func (o *objects) addElem(n0 int, e elem) {
	for _, el := range o.elems[n0:] {
		if el.key == e.key {
			return
		}
	}
	o.elems = append(o.elems, e)
}

// renderGrouped appends what a ServicePort DNATed by the shared rules
// wants (see maxGroup), elements only: per ClusterIP whose family has k
// usable endpoints, its key in cluster-ips(6), which comes with one
// element per endpoint in endpoints(6)-k<k>, `<clusterIP> . <proto> .
// <port> . <n> : <ip> . <port>` for n from 0 to k-1 in the ServicePort's
// order (groupElems); a ClusterIP of a family without endpoints in
// no-endpoint-services(6); and hairpin elements for the endpoints. An
// external or load-balancer address is a ClusterIP with, besides, its key
// in external-ips(6). A NodePort is the same with `<proto> . <nodePort>`
// in nodeports(6) and nodeport-endpoints(6)-k<k>, per family with
// endpoints, or in no-endpoint-nodeports when there are none.
func (r *svcRender) renderGrouped(cluster []int, o *objects) {
	for _, i := range cluster {
		o.hairpin = append(o.hairpin, r.addr(i))
	}
	n0 := len(o.elems)
	add := func(e elem) { o.addElem(n0, e) }
	sp := r.sp
	groups := map[bool]group{} // by family: IPv6 or not
	for _, v6 := range []bool{false, true} {
		var grp []netip.AddrPort
		for _, i := range cluster {
			if r.is6(i) == v6 {
				grp = append(grp, netip.AddrPortFrom(r.addr(i), sp.Endpoints[i].Port))
			}
		}
		groups[v6] = packGroup(grp)
	}
	addrs := func(ips []netip.Addr, external bool) {
		for _, ip := range ips {
			ip = ip.Unmap()
			v6 := ip.Is6()
			k := MapKey{Addr: ip, Protocol: r.proto, Port: sp.Port}
			if groups[v6] == "" {
				// Endpoints of the other family only: as a chain's
				// address with none of its own, rejected.
				add(elem{key: elemID{m: pick(v6, mapNoEndpointServices, mapNoEndpointServices6), k: k}, v: Goto(chainReject)})
				continue
			}
			add(elem{key: elemID{m: pick(v6, mapClusterIPs, mapClusterIPs6), k: k}, grp: groups[v6]})
			if external {
				add(elem{key: elemID{m: pick(v6, mapExternalIPs, mapExternalIPs6), k: k}})
			}
		}
	}
	addrs(sp.ClusterIPs, false)
	addrs(sp.ExternalIPs, true)
	addrs(sp.LoadBalancerIPs, true)
	if sp.NodePort == 0 {
		return
	}
	k := MapKey{Protocol: r.proto, Port: sp.NodePort}
	if len(cluster) == 0 {
		add(elem{key: elemID{m: mapNoEndpointNodePorts, k: k}, v: Goto(chainReject)})
		return
	}
	for _, v6 := range []bool{false, true} {
		if grp := groups[v6]; grp != "" {
			add(elem{key: elemID{m: pick(v6, mapNodePorts, mapNodePorts6), k: k}, grp: grp})
		}
	}
}

// svcRender renders one ServicePort's chains.
type svcRender struct {
	key     string
	sp      *servicemodel.ServicePort
	podCIDR netip.Prefix
	proto   string
	base    string   // HASH-ns/svc/proto/port
	names   []string // endpoint name bases, by index, made on first use
}

func (r *svcRender) endpointBase(i int) string {
	if r.names[i] == "" {
		r.names[i] = hashName(endpointReadable(r.key, r.sp.Endpoints[i]))
	}
	return r.names[i]
}

func (r *svcRender) endpointChainName(i int) string { return prefixEndpoint + r.endpointBase(i) }
func (r *svcRender) affinitySet(i int) string       { return prefixAffinity + r.endpointBase(i) }
func (r *svcRender) addr(i int) netip.Addr          { return r.sp.Endpoints[i].Addr.Unmap() }
func (r *svcRender) is6(i int) bool                 { return r.addr(i).Is6() }

// hasFamily reports whether the endpoints idx hold one of the family.
func (r *svcRender) hasFamily(idx []int, v6 bool) bool {
	for _, i := range idx {
		if r.is6(i) == v6 {
			return true
		}
	}
	return false
}

// policyChain balances over the endpoints idx; internal puts the
// ClusterIP masquerade rules first.
func (r *svcRender) policyChain(name string, idx []int, internal bool) chainDef {
	var rules []Rule
	if internal {
		for _, ip := range r.sp.ClusterIPs {
			ip = ip.Unmap()
			stmts := []Stmt{MatchAddr{Dst: true, Prefix: netip.PrefixFrom(ip, ip.BitLen())}}
			if r.podCIDR.Addr().Is6() == ip.Is6() {
				stmts = append(stmts, MatchAddr{Not: true, Prefix: r.podCIDR})
			}
			rules = append(rules, Rule{Stmts: append(stmts, VerdictStmt{Jump(chainMarkMasq)})})
		}
	}
	if r.sp.AffinityTimeout > 0 {
		for _, i := range idx {
			rules = append(rules, Rule{Stmts: []Stmt{
				SetLookup{Set: r.affinitySet(i), V6: r.is6(i)},
				VerdictStmt{Goto(r.endpointChainName(i))},
			}})
		}
	}
	for _, v6 := range []bool{false, true} {
		var fam []int
		for _, i := range idx {
			if r.is6(i) == v6 {
				fam = append(fam, i)
			}
		}
		// One endpoint in k: the first rule takes 1/k of the packets,
		// the next 1/(k-1) of the rest, and so on; the last takes what
		// is left. With affinity each goes to the endpoint's chain, which
		// remembers the client, and only a packet of the endpoint's
		// family may go there. Without, the rule DNATs at once and needs
		// no family match: the kernel's inet nat leaves a packet of the
		// other family alone and goes on to the next rule, so the other
		// family's packets pass these rules untouched, whatever their
		// draws, and reach their own.
		for n, i := range fam {
			var stmts []Stmt
			if r.sp.AffinityTimeout > 0 {
				stmts = append(stmts, MatchFamily{V6: v6})
			}
			if left := len(fam) - n; left > 1 {
				stmts = append(stmts, MatchRandom{Mod: uint32(left)})
			}
			if r.sp.AffinityTimeout > 0 {
				stmts = append(stmts, VerdictStmt{Goto(r.endpointChainName(i))})
			} else {
				stmts = append(stmts, r.dnat(i))
			}
			rules = append(rules, Rule{Stmts: stmts})
		}
	}
	return chainDef{Chain: Chain{Name: name}, rules: rules}
}

// externalChain is where NodePort, external and load-balancer traffic
// goes first.
func (r *svcRender) externalChain(name, serviceChain, localChain string, hasLocal bool) chainDef {
	markMasq := VerdictStmt{Jump(chainMarkMasq)}
	toService := VerdictStmt{Goto(serviceChain)}
	if !r.sp.ExternalLocal {
		return chainDef{Chain: Chain{Name: name}, rules: []Rule{
			{Stmts: []Stmt{markMasq}},
			{Stmts: []Stmt{toService}},
		}}
	}
	fromNode := MatchAddrType{}
	rules := []Rule{
		// Pods reach the Service as if through an outside load balancer,
		// whose policy does not apply to them.
		{Stmts: []Stmt{MatchAddr{Prefix: r.podCIDR}, toService}},
		// The node itself uses the (local) destination as its source:
		// masquerade it, or the reply would never leave the endpoint's pod.
		{Stmts: []Stmt{fromNode, markMasq}},
		{Stmts: []Stmt{fromNode, toService}},
	}
	if hasLocal {
		rules = append(rules, Rule{Stmts: []Stmt{VerdictStmt{Goto(localChain)}}})
	}
	return chainDef{Chain: Chain{Name: name}, rules: rules}
}

// endpointChain remembers the client for affinity and DNATs to endpoint
// i (a Service with affinity only).
func (r *svcRender) endpointChain(i int) chainDef {
	return chainDef{Chain: Chain{Name: r.endpointChainName(i)}, rules: []Rule{
		{Stmts: []Stmt{SetUpdate{Set: r.affinitySet(i), V6: r.is6(i)}}},
		{Stmts: []Stmt{r.dnat(i)}},
	}}
}

// dnat is `dnat to <ip>:<port>` of endpoint i. It needs no protocol
// match (which nft's syntax would add): only the Service's protocol is
// sent here, by the dispatch maps' keys.
func (r *svcRender) dnat(i int) Stmt {
	return DNAT{Addr: r.addr(i), Port: r.sp.Endpoints[i].Port}
}
