package nft

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/outpost-edge/outpost/netproxy/servicemodel"
)

// TableName is the one nftables table (family inet) outpost owns.
const TableName = "outpost"

// The outpost table's layout (family inet), after kube-proxy's nftables
// mode. Every chain, map and set name is here.
//
//	filter-input, filter-forward, filter-output (filter, priority -110)
//	    jump service-endpoints-check; jump nodeport-endpoints-check
//	nat-prerouting (nat, -100)   fib daddr type local jump hostports; jump services
//	nat-output (nat, -100)       the same, but not for loopback destinations
//	nat-postrouting (nat, 100)   jump masquerading; hairpin hostPort and pod egress masquerade
//	services                     masquerade marks for @cluster-ips(6) and
//	                             @external-ips(6); dnat through
//	                             @endpoints(6)-k1 … -k8; daddr . proto . dport vmap
//	                             @service-ips(6); local daddr: jump nodeports
//	nodeports                    masquerade marks for @nodeports(6); dnat through
//	                             @nodeport-endpoints(6)-k1 … -k8; proto . dport vmap
//	                             @service-nodeports
//	service-endpoints-check      daddr . proto . dport vmap @no-endpoint-services(6)
//	nodeport-endpoints-check     local daddr: proto . dport vmap @no-endpoint-nodeports
//	mark-for-masquerade, masquerading, reject-chain, hostports
//	service-/local-/external-HASH-ns/svc/proto/port, endpoint-HASH-…__ip/port
//	affinity-HASH-…__ip/port (sets)
//
// The filter chains run at priority -110 (kube-proxy's "dstnat - 10") so
// that they see the destination before DNAT in output; in input and
// forward the nat prerouting chain has run already, so a packet that was
// DNATed to an endpoint no longer matches the no-endpoint maps.

// Base chains, named type-hook.
const (
	filterInput    = "filter-input"
	filterForward  = "filter-forward"
	filterOutput   = "filter-output"
	natPrerouting  = "nat-prerouting"
	natOutput      = "nat-output"
	natPostrouting = "nat-postrouting"
)

// Base chain priorities, numeric (see Base).
const (
	priorityFilter = -110 // before dstnat (-100), as kube-proxy's "dstnat - 10"
	priorityDNAT   = -100
	prioritySNAT   = 100
)

// Regular chains with fixed names.
const (
	chainServices               = "services"
	chainHostPorts              = "hostports"
	chainMarkMasq               = "mark-for-masquerade"
	chainMasquerading           = "masquerading"
	chainReject                 = "reject-chain"
	chainServiceEndpointsCheck  = "service-endpoints-check"
	chainNodePortEndpointsCheck = "nodeport-endpoints-check"
	chainNodePorts              = "nodeports"
)

// Verdict maps, and the hairpin sets.
const (
	mapNameServiceIPs          = "service-ips"
	mapNameServiceIPs6         = "service-ips6"
	mapNameServiceNodePorts    = "service-nodeports"
	mapNameNoEndpointServices  = "no-endpoint-services"
	mapNameNoEndpointServices6 = "no-endpoint-services6"
	mapNameNoEndpointNodePorts = "no-endpoint-nodeports"
	mapNameHairpin             = "hairpin-endpoints"
	mapNameHairpin6            = "hairpin-endpoints6"
	mapNameClusterIPs          = "cluster-ips"
	mapNameClusterIPs6         = "cluster-ips6"
	mapNameNodePorts           = "nodeports"
	mapNameNodePorts6          = "nodeports6"
	mapNameExternalIPs         = "external-ips"
	mapNameExternalIPs6        = "external-ips6"
)

// maxGroup is the most endpoints (of one address family) a Service may
// have to be DNATed by the shared rules of the services chain: one rule
// per endpoint count k, `dnat ip to ip daddr . meta l4proto . th dport .
// numgen random mod k map @endpoints-k<k>` (and endpoints6-k<k> for
// IPv6), whose maps hold every such Service's endpoints. Such a Service
// is elements only, so adding, changing or removing it does not make the
// kernel check the whole table at commit. Under the Cluster external
// traffic policy, its external and load-balancer addresses are DNATed by
// the same rules (their keys are in cluster-ips(6) and, to be
// masqueraded from anywhere, external-ips(6)), and its NodePort by the
// rules of the nodeports chain, through the maps nodeport-endpoints(6)-k<k>
// keyed by protocol, port and draw. A Service with more endpoints,
// ClientIP affinity or a Local traffic policy has chains of its own.
const maxGroup = 8

// endpointsMapName is the name of the endpoint map for Services with k
// endpoints of the family.
func endpointsMapName(v6 bool, k int) string {
	if v6 {
		return "endpoints6-k" + strconv.Itoa(k)
	}
	return "endpoints-k" + strconv.Itoa(k)
}

// nodePortEndpointsMapName is the name of the endpoint map for NodePorts
// with k endpoints of the family.
func nodePortEndpointsMapName(v6 bool, k int) string {
	return "nodeport-" + endpointsMapName(v6, k)
}

// Name prefixes of per-ServicePort chains and sets, followed by
// HASH-ns/svc/proto/port: such a name always holds a "/", which no fixed
// name does, so the two never collide. (A full sync deletes whatever it
// does not want, whatever its name.)
const (
	prefixService  = "service-"  // cluster-wide endpoints
	prefixLocal    = "local-"    // this node's endpoints
	prefixExternal = "external-" // NodePort, external and load-balancer IPs
	prefixEndpoint = "endpoint-" // one endpoint of a Service with affinity: affinity, DNAT
	prefixAffinity = "affinity-" // set of clients stuck to one endpoint
)

// masqBit is the packet mark bit that asks masquerading to masquerade.
const masqBit = 0x4000

// mapID indexes tableMaps.
type mapID uint8

const (
	mapServiceIPs mapID = iota
	mapServiceIPs6
	mapServiceNodePorts
	mapNoEndpointServices
	mapNoEndpointServices6
	mapNoEndpointNodePorts
	mapHairpin
	mapHairpin6
	mapClusterIPs
	mapClusterIPs6
	mapNodePorts
	mapNodePorts6
	mapExternalIPs
	mapExternalIPs6
	mapEndpoints                                    // endpoints-k1; endpoints-k<k> is mapEndpoints+k-1
	mapEndpoints6         = mapEndpoints + maxGroup // endpoints6-k1
	mapNodePortEndpoints  = mapEndpoints6 + maxGroup
	mapNodePortEndpoints6 = mapNodePortEndpoints + maxGroup
	numMaps               = mapNodePortEndpoints6 + maxGroup
)

var tableMaps = func() [numMaps]Map {
	m := [numMaps]Map{
		mapServiceIPs:          {Name: mapNameServiceIPs, Key: KeyAddr4ProtoPort},
		mapServiceIPs6:         {Name: mapNameServiceIPs6, Key: KeyAddr6ProtoPort},
		mapServiceNodePorts:    {Name: mapNameServiceNodePorts, Key: KeyProtoPort},
		mapNoEndpointServices:  {Name: mapNameNoEndpointServices, Key: KeyAddr4ProtoPort},
		mapNoEndpointServices6: {Name: mapNameNoEndpointServices6, Key: KeyAddr6ProtoPort},
		mapNoEndpointNodePorts: {Name: mapNameNoEndpointNodePorts, Key: KeyProtoPort},
		mapHairpin:             {Name: mapNameHairpin, Key: KeyAddr4Pair, Set: true},
		mapHairpin6:            {Name: mapNameHairpin6, Key: KeyAddr6Pair, Set: true},
		mapClusterIPs:          {Name: mapNameClusterIPs, Key: KeyAddr4ProtoPort, Set: true},
		mapClusterIPs6:         {Name: mapNameClusterIPs6, Key: KeyAddr6ProtoPort, Set: true},
		mapNodePorts:           {Name: mapNameNodePorts, Key: KeyProtoPort, Set: true},
		mapNodePorts6:          {Name: mapNameNodePorts6, Key: KeyProtoPort, Set: true},
		mapExternalIPs:         {Name: mapNameExternalIPs, Key: KeyAddr4ProtoPort, Set: true},
		mapExternalIPs6:        {Name: mapNameExternalIPs6, Key: KeyAddr6ProtoPort, Set: true},
	}
	for k := 1; k <= maxGroup; k++ {
		m[endpointsMap(false, k)] = Map{Name: endpointsMapName(false, k), Key: KeyAddr4ProtoPortIndex}
		m[endpointsMap(true, k)] = Map{Name: endpointsMapName(true, k), Key: KeyAddr6ProtoPortIndex}
		m[nodePortEndpointsMap(false, k)] = Map{Name: nodePortEndpointsMapName(false, k), Key: KeyProtoPortIndex}
		m[nodePortEndpointsMap(true, k)] = Map{Name: nodePortEndpointsMapName(true, k), Key: KeyProtoPortIndex, V6: true}
	}
	return m
}()

// endpointsMap is the endpoint map for Services with k (1 to maxGroup)
// endpoints of the family.
func endpointsMap(v6 bool, k int) mapID {
	if v6 {
		return mapEndpoints6 + mapID(k-1)
	}
	return mapEndpoints + mapID(k-1)
}

// nodePortEndpointsMap is the endpoint map for NodePorts with k (1 to
// maxGroup) endpoints of the family.
func nodePortEndpointsMap(v6 bool, k int) mapID {
	if v6 {
		return mapNodePortEndpoints6 + mapID(k-1)
	}
	return mapNodePortEndpoints + mapID(k-1)
}

var (
	loopback4 = netip.MustParsePrefix("127.0.0.0/8")
	loopback6 = netip.MustParsePrefix("::1/128")
)

// State is everything the outpost table holds.
type State struct {
	// PodCIDR is the node's pod range: traffic from it to anywhere
	// outside it is masqueraded, and traffic from outside it to a
	// ClusterIP is masqueraded (it may come back through another node).
	PodCIDR netip.Prefix
	// HostPorts are DNATed from the node's addresses to their pods, with
	// hairpin masquerade for pods reaching a hostPort.
	HostPorts []HostPort
	// Services are the ServicePorts to proxy. Two with the same String()
	// keep the first.
	Services []servicemodel.ServicePort
}

// Table keeps the outpost table equal to a State, applying only
// differences. It holds the last applied State (compactly: the
// ServicePorts themselves, from which their rules are rendered again when
// they change) and, after a failed apply, syncs in full.
type Table struct {
	rs Ruleset

	mu        sync.Mutex
	full      bool // the next Sync is full
	podCIDR   netip.Prefix
	hostPorts []HostPort
	services  map[string]*svcEntry // by ServicePort.String()
	elems     map[elemID]claims    // map elements and who wants them
	hairpin   addrCounts           // hairpin elements and how many ServicePorts want each
	gen       uint64               // Sync generation, to find services gone
	keyBuf    []byte
	chains    int // chain and rule totals, for Counts
	rules     int
	grouped   int  // endpoint map elements, for Counts
	shared    bool // keep the callers' ServicePorts (ShareServicePorts)
}

// svcEntry is one applied ServicePort.
type svcEntry struct {
	key string
	sp  *servicemodel.ServicePort // a copy, or the caller's (ShareServicePorts)
	gen uint64
}

// Ruleset is what a Table applies its Txs through: Netlink, or
// netproxy/nfttest's Fake in tests (proxy.Ruleset is the same).
type Ruleset interface {
	// Apply applies tx atomically: all of it or none.
	Apply(tx *Tx) error
	// List returns what the table holds; an absent table holds nothing.
	List() (Contents, error)
}

// NewTable returns a Table that applies changes through rs (Netlink, or
// nfttest.Fake in tests). It does not touch rs: the first Sync does.
func NewTable(rs Ruleset) *Table {
	return &Table{rs: rs, full: true, hairpin: newAddrCounts(0)}
}

// Resync makes the next Sync full (after a configuration change, or to
// repair a table someone else changed).
func (t *Table) Resync() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.full = true
}

// Full reports whether the next Sync will be a full one: the first, or
// one after a failed apply or Resync (or with another PodCIDR).
func (t *Table) Full() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.full
}

// Counts returns the number of chains, rules and map elements the table
// holds as last applied.
func (t *Table) Counts() (chains, rules, elements int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.chains, t.rules, len(t.elems) + t.hairpin.len() + t.grouped
}

// Sync makes the table hold s. The first call, a call after a failed
// apply or after Resync, and a call with another PodCIDR sync in full: one
// Tx that flushes every chain of the table, deletes its maps, its base
// chains and every chain and set not wanted, and adds everything wanted
// (keeping wanted affinity sets, whose contents are session state). Every other call
// applies one Tx holding only the difference from the last applied state,
// whose size depends on what changed, not on how many services there are.
// Sync returns the number of ops applied; nothing is applied when s is
// invalid.
func (t *Table) Sync(s State) (ops int, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !s.PodCIDR.IsValid() {
		return 0, fmt.Errorf("sync table %s: pod CIDR is not set", TableName)
	}
	if s.PodCIDR.Masked() != s.PodCIDR {
		return 0, fmt.Errorf("sync table %s: pod CIDR %s: not a network address (want %s)", TableName, s.PodCIDR, s.PodCIDR.Masked())
	}
	hostPorts, err := normalize(s.HostPorts)
	if err != nil {
		return 0, fmt.Errorf("sync table %s: %w", TableName, err)
	}
	if t.full || s.PodCIDR != t.podCIDR {
		ops, err = t.syncFull(s.PodCIDR, hostPorts, s.Services)
	} else {
		ops, err = t.syncDiff(hostPorts, s.Services)
	}
	if err != nil {
		return 0, fmt.Errorf("sync table %s: %w", TableName, err)
	}
	return ops, nil
}

// objects are the named things one unit (a ServicePort, or the fixed
// part of the table) wants.
type objects struct {
	chains  []chainDef
	sets    []AddrSet
	elems   []elem
	hairpin []netip.Addr // endpoints, each an element `ip . ip` of hairpin-endpoints(6)
}

// hairpinElem is the element of the set hairpin-endpoints(6) for
// endpoint a.
func hairpinElem(a netip.Addr) (Map, MapKey) {
	return tableMaps[pick(a.Is6(), mapHairpin, mapHairpin6)], MapKey{Addr: a, Addr2: a}
}

type chainDef struct {
	Chain
	rules []Rule
}

type elem struct {
	key elemID
	v   Verdict
	// grp are the endpoints of a cluster-ips(6) key (a ClusterIP of a
	// Service DNATed by the shared rules): the key comes with one element
	// per endpoint in the endpoint map for their number (groupElems).
	grp group
}

// group is the endpoints of a cluster-ips(6) key, packed in a string: a
// byte with the width of an address (4 or 16, the key's family), then
// each endpoint's address and port (big-endian). At 10,000 Services × 5
// endpoints a []netip.AddrPort each took 1.9 MiB of the heap, this 0.3.
type group string

// packGroup packs eps, all of one family.
func packGroup(eps []netip.AddrPort) group {
	if len(eps) == 0 {
		return ""
	}
	w := 4
	if eps[0].Addr().Is6() {
		w = 16
	}
	b := make([]byte, 1, 1+len(eps)*(w+2))
	b[0] = byte(w)
	for _, ep := range eps {
		b = append(b, ep.Addr().AsSlice()...)
		b = append(b, byte(ep.Port()>>8), byte(ep.Port()))
	}
	return group(b)
}

// len is the number of endpoints in g.
func (g group) len() int {
	if g == "" {
		return 0
	}
	return (len(g) - 1) / (int(g[0]) + 2)
}

// at is endpoint n of g.
func (g group) at(n int) netip.AddrPort {
	w := int(g[0])
	e := g[1+n*(w+2):][:w+2]
	a, _ := netip.AddrFromSlice([]byte(e[:w])) // 4 bytes: IPv4
	return netip.AddrPortFrom(a, uint16(e[w])<<8|uint16(e[w+1]))
}

// groupElems are the endpoint map elements that come with the
// cluster-ips(6) key k when its endpoints are grp: `k . n : grp.at(n)`
// in endpoints(6)-k<grp.len()>; or, for a key of nodeports(6),
// nodeport-endpoints(6)-k<grp.len()>.
func groupElems(k elemID, grp group) (mapID, []MapKey) {
	if grp == "" {
		return 0, nil
	}
	keys := make([]MapKey, grp.len())
	for n := range keys {
		keys[n] = k.k
		keys[n].Index = uint32(n)
	}
	switch k.m {
	case mapNodePorts, mapNodePorts6:
		return nodePortEndpointsMap(k.m == mapNodePorts6, len(keys)), keys
	}
	return endpointsMap(k.k.Addr.Is6(), len(keys)), keys
}

// addElem appends the OpAddElem of key k mapping to v, and those of the
// endpoint elements that come with it.
func addElem(tx *Tx, k elemID, v Verdict, grp group) {
	tx.AddElem(tableMaps[k.m], k.k, v)
	m, keys := groupElems(k, grp)
	for n, ek := range keys {
		tx.AddEndpointElem(tableMaps[m], ek, grp.at(n))
	}
}

// delElem appends the OpDelElem of key k and of the endpoint elements
// that came with it.
func delElem(tx *Tx, k elemID, grp group) {
	tx.DelElem(tableMaps[k.m], k.k)
	m, keys := groupElems(k, grp)
	for _, ek := range keys {
		tx.DelElem(tableMaps[m], ek)
	}
}

// changeGroup appends what turns the endpoint elements of cluster-ips or
// nodeports key k from those of old to those of cur (both not empty):
// when their number is the same, only the endpoints that differ are
// replaced.
func changeGroup(tx *Tx, k elemID, old, cur group) {
	om, okeys := groupElems(k, old)
	cm, ckeys := groupElems(k, cur)
	for n, ek := range okeys {
		if om != cm || old.at(n) != cur.at(n) {
			tx.DelElem(tableMaps[om], ek)
		}
	}
	for n, ek := range ckeys {
		if om != cm || old.at(n) != cur.at(n) {
			tx.AddEndpointElem(tableMaps[cm], ek, cur.at(n))
		}
	}
}

type elemID struct {
	m mapID
	k MapKey
}

// claim is one ServicePort's wish for a map element. Two ServicePorts may
// want the same key (an external IP shared by two Services): the lowest
// ServicePort name wins, whatever the order they came in.
type claim struct {
	svc string
	v   Verdict
	grp group
}

// claims are the claims on one key, sorted by svc; first is the one in
// the table. The zero value is no claim.
type claims struct {
	first claim
	rest  []claim
}

func (c claims) empty() bool { return c.first.svc == "" }

func (c claims) with(n claim) claims {
	if c.empty() {
		return claims{first: n}
	}
	all := append([]claim{c.first}, c.rest...)
	i, _ := slices.BinarySearchFunc(all, n.svc, func(a claim, svc string) int { return strings.Compare(a.svc, svc) })
	all = slices.Insert(all, i, n)
	return claims{first: all[0], rest: all[1:]}
}

func (c claims) without(svc string) claims {
	if c.first.svc == svc {
		if len(c.rest) == 0 {
			return claims{}
		}
		return claims{first: c.rest[0], rest: c.rest[1:]}
	}
	rest := slices.DeleteFunc(slices.Clone(c.rest), func(a claim) bool { return a.svc == svc })
	if len(rest) == 0 {
		rest = nil
	}
	return claims{first: c.first, rest: rest}
}

// syncFull renders everything and replaces the table's contents in one Tx.
func (t *Table) syncFull(podCIDR netip.Prefix, hostPorts []HostPort, services []servicemodel.ServicePort) (int, error) {
	t.full = true
	entries := make(map[string]*svcEntry, len(services))
	keys := make([]string, 0, len(services))
	for i := range services {
		sp := &services[i]
		t.keyBuf = appendKey(t.keyBuf[:0], sp)
		if _, dup := entries[string(t.keyBuf)]; dup {
			continue
		}
		if err := checkServicePort(sp); err != nil {
			return 0, err
		}
		k := string(t.keyBuf)
		entries[k] = &svcEntry{key: k, sp: sp}
		keys = append(keys, k)
	}
	slices.Sort(keys)

	cont, err := t.rs.List()
	if err != nil {
		return 0, fmt.Errorf("list: %w", err)
	}
	existingSets := make(map[string]bool, len(cont.Sets))
	for _, s := range cont.Sets {
		existingSets[s] = true
	}

	var o objects
	o.chains = renderFixed(podCIDR, hostPorts)
	var recreate []string // existing affinity sets whose timeout changes
	elems := make(map[elemID]claims, len(keys))
	elemEnd := make([]int, len(keys)) // o.elems[elemEnd[i-1]:elemEnd[i]] are keys[i]'s
	for i, k := range keys {
		e := entries[k]
		s0, el0 := len(o.sets), len(o.elems)
		renderService(k, e.sp, podCIDR, &o)
		elemEnd[i] = len(o.elems)
		for _, el := range o.elems[el0:] {
			elems[el.key] = elems[el.key].with(claim{svc: k, v: el.v, grp: el.grp})
		}
		if old := t.services[k]; old != nil && old.sp.AffinityTimeout != e.sp.AffinityTimeout {
			for _, s := range o.sets[s0:] {
				if existingSets[s.Name] {
					recreate = append(recreate, s.Name)
				}
			}
		}
	}

	nRules := 0
	for _, c := range o.chains {
		nRules += len(c.rules)
	}
	// Sized up front: a cold sync of 10,000 services is ~200,000 ops.
	tx := &Tx{Ops: make([]Op, 0, 2*len(cont.Chains)+len(cont.Maps)+len(cont.Sets)+len(recreate)+
		len(tableMaps)+len(o.sets)+len(o.chains)+nRules+len(o.elems)+len(o.hairpin))}
	for _, c := range cont.Chains {
		tx.FlushChain(c)
	}
	for _, m := range cont.Maps {
		tx.DelMap(Map{Name: m})
	}
	// Base chains are deleted and added again, in case one exists with
	// another hook or priority (nothing can jump to them, so they go
	// once flushed).
	wanted := make(map[string]bool, len(o.chains)+len(o.sets))
	for _, c := range o.chains {
		wanted[c.Name] = c.Base == nil
	}
	for _, s := range o.sets {
		wanted[s.Name] = true
	}
	for _, c := range cont.Chains {
		if !wanted[c] {
			tx.DelChain(c)
		}
	}
	for _, s := range cont.Sets {
		if !wanted[s] {
			tx.DelSet(AddrSet{Name: s})
		}
	}
	for _, s := range recreate {
		tx.DelSet(AddrSet{Name: s})
	}
	for _, m := range tableMaps {
		tx.AddMap(m)
	}
	for _, s := range o.sets {
		tx.AddSet(s)
	}
	for _, c := range o.chains {
		tx.AddChain(c.Chain)
	}
	for _, c := range o.chains {
		addRules(tx, c.Name, c.rules)
	}
	start, grouped := 0, 0
	for i, k := range keys {
		// Each element once, from the claim that won it.
		for _, el := range o.elems[start:elemEnd[i]] {
			if elems[el.key].first.svc == k {
				addElem(tx, el.key, el.v, el.grp)
				grouped += el.grp.len()
			}
		}
		start = elemEnd[i]
	}
	hairpin := newAddrCounts(len(o.hairpin))
	for _, a := range o.hairpin {
		if hairpin.add(a, 1) == 1 {
			m, k := hairpinElem(a)
			tx.AddElem(m, k, Verdict{})
		}
	}

	if err := t.rs.Apply(tx); err != nil {
		return 0, fmt.Errorf("apply full sync (%d ops): %w", len(tx.Ops), err)
	}
	for _, e := range entries {
		e.sp = t.keep(e.sp)
		e.gen = t.gen
	}
	t.full = false
	t.podCIDR = podCIDR
	t.hostPorts = hostPorts
	t.services = entries
	t.elems = elems
	t.hairpin = hairpin
	t.chains = len(o.chains)
	t.rules = nRules
	t.grouped = grouped
	return len(tx.Ops), nil
}

// addRules appends OpAddRule for each of rules.
func addRules(tx *Tx, chain string, rules []Rule) {
	for _, r := range rules {
		tx.Ops = append(tx.Ops, Op{Kind: OpAddRule, Chain: Chain{Name: chain}, Rule: r})
	}
}

// delta collects an incremental Tx in the order it is applied.
type delta struct {
	addSets     []AddrSet
	addChains   []chainDef // new: added empty, then filled
	changed     []chainDef // flushed and refilled
	recreate    []AddrSet  // sets whose timeout changed: deleted and added again
	delChains   []string
	delSets     []AddrSet
	dChains     int
	dRules      int
	dGrouped    int               // change of the number of endpoint map elements
	next        map[elemID]claims // claims after the change, for touched keys
	touched     []elemID
	touchedFrom map[elemID]claim     // the element in the table before
	hairpin     map[netip.Addr]int32 // change of each hairpin element's count
	hairpinKeys []netip.Addr         // hairpin's keys, in the order first seen
	hairpinFrom addrCounts           // the counts before the Tx
}

// addrCounts counts addresses. IPv4 ones, nearly all of them, are
// keyed by their 4 bytes: at 10,000 Services × 5 endpoints a map keyed
// by netip.Addr (24 bytes, a pointer the collector scans) took 3.6 MiB,
// this one 0.6.
type addrCounts struct {
	v4 map[[4]byte]int32
	v6 map[netip.Addr]int32
}

func newAddrCounts(n int) addrCounts {
	return addrCounts{v4: make(map[[4]byte]int32, n), v6: map[netip.Addr]int32{}}
}

func (c addrCounts) get(a netip.Addr) int32 {
	if a.Is4() {
		return c.v4[a.As4()]
	}
	return c.v6[a]
}

// add changes a's count by n and returns the new count; a count of 0 is
// no entry.
func (c addrCounts) add(a netip.Addr, n int32) int32 {
	if a.Is4() {
		return bump(c.v4, a.As4(), n)
	}
	return bump(c.v6, a, n)
}

func (c addrCounts) len() int { return len(c.v4) + len(c.v6) }

func bump[K comparable](m map[K]int32, k K, n int32) int32 {
	v := m[k] + n
	if v == 0 {
		delete(m, k)
	} else {
		m[k] = v
	}
	return v
}

// bumpHairpin changes the count of hairpin element a by n.
func (d *delta) bumpHairpin(a netip.Addr, n int32) {
	if d.hairpin == nil {
		d.hairpin = map[netip.Addr]int32{}
	}
	if _, ok := d.hairpin[a]; !ok {
		d.hairpinKeys = append(d.hairpinKeys, a)
	}
	d.hairpin[a] += n
}

// unit diffs one unit's objects, before and after (either may be empty);
// applied are the map elements' claims before the Tx.
func (d *delta) unit(svc string, old, cur *objects, applied map[elemID]claims) {
	oldChains := make(map[string]*chainDef, len(old.chains))
	for i := range old.chains {
		oldChains[old.chains[i].Name] = &old.chains[i]
	}
	oldSets := make(map[string]AddrSet, len(old.sets))
	for _, s := range old.sets {
		oldSets[s.Name] = s
	}
	recreated := false
	curSets := make(map[string]bool, len(cur.sets))
	for _, s := range cur.sets {
		curSets[s.Name] = true
		os, ok := oldSets[s.Name]
		switch {
		case !ok:
			d.addSets = append(d.addSets, s)
		case os != s:
			d.recreate = append(d.recreate, s)
			recreated = true
		}
	}
	for _, s := range old.sets {
		if !curSets[s.Name] {
			d.delSets = append(d.delSets, s)
		}
	}
	curChains := make(map[string]bool, len(cur.chains))
	for _, c := range cur.chains {
		curChains[c.Name] = true
		oc := oldChains[c.Name]
		switch {
		case oc == nil:
			d.addChains = append(d.addChains, c)
		case recreated || !sameRules(oc.rules, c.rules):
			// A re-created set must not be referenced when it is deleted:
			// refill every chain of the unit.
			d.changed = append(d.changed, c)
		}
		d.dRules += len(c.rules)
	}
	for _, c := range old.chains {
		if !curChains[c.Name] {
			d.delChains = append(d.delChains, c.Name)
		}
		d.dRules -= len(c.rules)
	}
	d.dChains += len(cur.chains) - len(old.chains)
	for _, a := range old.hairpin {
		d.bumpHairpin(a, -1)
	}
	for _, a := range cur.hairpin {
		d.bumpHairpin(a, 1)
	}
	if svc == "" {
		return
	}
	for _, el := range old.elems {
		d.touch(applied, el.key)
		d.next[el.key] = d.next[el.key].without(svc)
	}
	for _, el := range cur.elems {
		d.touch(applied, el.key)
		d.next[el.key] = d.next[el.key].with(claim{svc: svc, v: el.v, grp: el.grp})
	}
}

// syncDiff applies the difference between the last applied state and
// (hostPorts, services) with the same pod CIDR.
func (t *Table) syncDiff(hostPorts []HostPort, services []servicemodel.ServicePort) (int, error) {
	t.gen++
	var changes []change
	var added map[string]bool
	for i := range services {
		sp := &services[i]
		t.keyBuf = appendKey(t.keyBuf[:0], sp)
		if e := t.services[string(t.keyBuf)]; e != nil {
			if e.gen == t.gen {
				continue // a duplicate: the first one counts
			}
			e.gen = t.gen
			if equalServicePort(e.sp, sp) {
				if t.shared {
					// The caller's newer copy: the one it keeps (the
					// Index adopts what its Ports hands out), so the
					// older can be freed.
					e.sp = sp
				}
				continue
			}
			if err := checkServicePort(sp); err != nil {
				return 0, err
			}
			changes = append(changes, change{e.key, e, sp})
			continue
		}
		if added[string(t.keyBuf)] {
			continue
		}
		if err := checkServicePort(sp); err != nil {
			return 0, err
		}
		if added == nil {
			added = map[string]bool{}
		}
		k := string(t.keyBuf)
		added[k] = true
		changes = append(changes, change{k, nil, sp})
	}
	for k, e := range t.services {
		if e.gen != t.gen {
			changes = append(changes, change{k, e, nil})
		}
	}
	return t.applyDiff(hostPorts, changes)
}

// change is one ServicePort's change: added (old nil), removed (cur nil)
// or changed.
type change struct {
	key string
	old *svcEntry
	cur *servicemodel.ServicePort
}

// Update applies changes to the ServicePorts, and hostPorts, as Sync
// would with the last applied state so changed, but without going over
// the ServicePorts that did not change: what it costs depends on what
// changed, not on how many there are. Each change names a ServicePort by
// its String() and holds its new value, or nil when it is gone; a change
// to the value last applied is no change, and of two with the same key
// the first counts. A Table that must sync in full (Full) refuses it.
func (t *Table) Update(hostPorts []HostPort, changes []servicemodel.PortChange) (ops int, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.full {
		return 0, fmt.Errorf("update table %s: the table needs a full sync", TableName)
	}
	hostPorts, err = normalize(hostPorts)
	if err != nil {
		return 0, fmt.Errorf("update table %s: %w", TableName, err)
	}
	var diff []change
	seen := make(map[string]bool, len(changes))
	for _, c := range changes {
		if seen[c.Key] {
			continue
		}
		seen[c.Key] = true
		e := t.services[c.Key]
		if c.Port == nil {
			if e != nil {
				diff = append(diff, change{c.Key, e, nil})
			}
			continue
		}
		if t.keyBuf = appendKey(t.keyBuf[:0], c.Port); string(t.keyBuf) != c.Key {
			return 0, fmt.Errorf("update table %s: service port %s given as %q", TableName, t.keyBuf, c.Key)
		}
		if e != nil && equalServicePort(e.sp, c.Port) {
			if t.shared {
				e.sp = c.Port // the one the caller keeps, as in syncDiff
			}
			continue
		}
		if err := checkServicePort(c.Port); err != nil {
			return 0, fmt.Errorf("update table %s: %w", TableName, err)
		}
		diff = append(diff, change{c.Key, e, c.Port})
	}
	ops, err = t.applyDiff(hostPorts, diff)
	if err != nil {
		return 0, fmt.Errorf("update table %s: %w", TableName, err)
	}
	return ops, nil
}

// applyDiff applies changes, and hostPorts, to the last applied state.
func (t *Table) applyDiff(hostPorts []HostPort, changes []change) (int, error) {
	fixedChanged := !slices.Equal(hostPorts, t.hostPorts)
	if len(changes) == 0 && !fixedChanged {
		return 0, nil
	}
	slices.SortFunc(changes, func(a, b change) int { return strings.Compare(a.key, b.key) })

	d := &delta{next: map[elemID]claims{}, hairpinFrom: t.hairpin}
	if fixedChanged {
		old := objects{chains: renderFixed(t.podCIDR, t.hostPorts)}
		cur := objects{chains: renderFixed(t.podCIDR, hostPorts)}
		d.unit("", &old, &cur, t.elems)
	}
	for _, ch := range changes {
		var old, cur objects
		if ch.old != nil {
			renderService(ch.key, ch.old.sp, t.podCIDR, &old)
		}
		if ch.cur != nil {
			renderService(ch.key, ch.cur, t.podCIDR, &cur)
		}
		d.unit(ch.key, &old, &cur, t.elems)
	}
	tx := d.tx()
	if len(tx.Ops) > 0 {
		if err := t.rs.Apply(tx); err != nil {
			t.full = true
			return 0, fmt.Errorf("apply %d changes (%d ops): %w", len(changes), len(tx.Ops), err)
		}
	}
	t.commitDiff(hostPorts, d)
	for _, ch := range changes {
		t.commitService(ch.key, ch.old, ch.cur)
	}
	return len(tx.Ops), nil
}

// touch records the claims on k before the change, once.
func (d *delta) touch(applied map[elemID]claims, k elemID) {
	if _, ok := d.next[k]; ok {
		return
	}
	if d.touchedFrom == nil {
		d.touchedFrom = map[elemID]claim{}
	}
	c := applied[k]
	d.next[k] = c
	d.touchedFrom[k] = c.first
	d.touched = append(d.touched, k)
}

// tx orders the delta's ops: add new sets and chains (empty); flush
// changed chains; re-create sets whose timeout changed (once no rule uses
// them); fill new and changed chains; add map elements (a changed verdict
// is delete then add); delete stale elements; flush removed chains; delete
// removed chains and sets.
func (d *delta) tx() *Tx {
	tx := &Tx{}
	for _, s := range d.addSets {
		tx.AddSet(s)
	}
	for _, c := range d.addChains {
		tx.AddChain(c.Chain)
	}
	for _, c := range d.changed {
		tx.FlushChain(c.Name)
	}
	flushedRemoved := false
	if len(d.recreate) > 0 {
		// A set is deleted only when no rule uses it: empty the chains
		// going away before, and fill the new ones after.
		for _, c := range d.delChains {
			tx.FlushChain(c)
		}
		flushedRemoved = true
		for _, s := range d.recreate {
			tx.DelSet(s)
			tx.AddSet(s)
		}
	}
	for _, c := range d.addChains {
		addRules(tx, c.Name, c.rules)
	}
	for _, c := range d.changed {
		addRules(tx, c.Name, c.rules)
	}
	for _, k := range d.touched {
		before, after := d.touchedFrom[k], d.next[k].first
		if after.svc == "" {
			continue
		}
		d.dGrouped += after.grp.len() - before.grp.len()
		if before.svc != "" {
			if before.v == after.v {
				if before.grp != after.grp {
					changeGroup(tx, k, before.grp, after.grp)
				}
				continue
			}
			delElem(tx, k, before.grp)
		}
		addElem(tx, k, after.v, after.grp)
	}
	for _, a := range d.hairpinKeys {
		if before := d.hairpinFrom.get(a); before == 0 && before+d.hairpin[a] > 0 {
			m, k := hairpinElem(a)
			tx.AddElem(m, k, Verdict{})
		}
	}
	for _, k := range d.touched {
		if before := d.touchedFrom[k]; before.svc != "" && d.next[k].empty() {
			d.dGrouped -= before.grp.len()
			delElem(tx, k, before.grp)
		}
	}
	for _, a := range d.hairpinKeys {
		if before := d.hairpinFrom.get(a); before > 0 && before+d.hairpin[a] == 0 {
			m, k := hairpinElem(a)
			tx.DelElem(m, k)
		}
	}
	if !flushedRemoved {
		for _, c := range d.delChains {
			tx.FlushChain(c)
		}
	}
	for _, c := range d.delChains {
		tx.DelChain(c)
	}
	for _, s := range d.delSets {
		tx.DelSet(s)
	}
	return tx
}

// commitDiff records an applied delta's fixed part and elements.
func (t *Table) commitDiff(hostPorts []HostPort, d *delta) {
	t.hostPorts = hostPorts
	for _, k := range d.touched {
		if c := d.next[k]; c.empty() {
			delete(t.elems, k)
		} else {
			t.elems[k] = c
		}
	}
	for a, n := range d.hairpin {
		t.hairpin.add(a, n)
	}
	t.chains += d.dChains
	t.rules += d.dRules
	t.grouped += d.dGrouped
}

// commitService records an applied change of one ServicePort.
func (t *Table) commitService(key string, old *svcEntry, cur *servicemodel.ServicePort) {
	switch {
	case cur == nil:
		delete(t.services, key)
	case old == nil:
		t.services[key] = &svcEntry{key: key, sp: t.keep(cur), gen: t.gen}
	default:
		old.sp = t.keep(cur)
	}
}

// sameRules reports whether two rule lists print the same.
func sameRules(a, b []Rule) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].String() != b[i].String() {
			return false
		}
	}
	return true
}

// renderFixed renders the chains that do not belong to one ServicePort.
func renderFixed(podCIDR netip.Prefix, hostPorts []HostPort) []chainDef {
	jump := func(c string) Stmt { return VerdictStmt{Jump(c)} }
	rule := func(stmts ...Stmt) Rule { return Rule{Stmts: stmts} }
	base := func(name string, typ ChainType, hook Hook, prio int32, rules ...Rule) chainDef {
		return chainDef{Chain: Chain{Name: name, Base: &Base{Type: typ, Hook: hook, Priority: prio}}, rules: rules}
	}
	regular := func(name string, rules ...Rule) chainDef {
		return chainDef{Chain: Chain{Name: name}, rules: rules}
	}
	local := MatchAddrType{Dst: true}
	notLoopback4 := MatchAddr{Dst: true, Not: true, Prefix: loopback4}
	notLoopback6 := MatchAddr{Dst: true, Not: true, Prefix: loopback6}
	endpointChecks := []Rule{rule(jump(chainServiceEndpointsCheck)), rule(jump(chainNodePortEndpointsCheck))}
	lookup := func(m mapID) MapLookup { return MapLookup{Map: tableMaps[m].Name, Key: tableMaps[m].Key} }

	// A pod sent to itself through a Service (source = destination
	// after DNAT) is masqueraded, or its answer would not come back
	// through the DNAT: hairpin-endpoints(6) hold `ip . ip` of every
	// endpoint.
	matchSet := func(m mapID) MatchSet { return MatchSet{Set: tableMaps[m].Name, Key: tableMaps[m].Key} }

	// The Services DNATed by the shared rules (see maxGroup): traffic to
	// their cluster IPs from outside the pod CIDR is masqueraded (from
	// anywhere, for the family the pod CIDR is not), then one rule per
	// endpoint count and family DNATs.
	services := make([]Rule, 0, 6+2*maxGroup)
	for _, v6 := range []bool{false, true} {
		stmts := []Stmt{matchSet(pick(v6, mapClusterIPs, mapClusterIPs6))}
		if podCIDR.Addr().Is6() == v6 {
			stmts = append(stmts, MatchAddr{Not: true, Prefix: podCIDR})
		}
		services = append(services, rule(append(stmts, jump(chainMarkMasq))...))
	}
	// Their external and load-balancer addresses, under the Cluster
	// policy, are masqueraded whatever the source, then DNATed as the
	// cluster IPs are (their keys are in cluster-ips(6) too).
	for _, v6 := range []bool{false, true} {
		services = append(services, rule(matchSet(pick(v6, mapExternalIPs, mapExternalIPs6)), jump(chainMarkMasq)))
	}
	for _, v6 := range []bool{false, true} {
		for k := 1; k <= maxGroup; k++ {
			services = append(services, rule(DNATMap{Map: endpointsMapName(v6, k), V6: v6, Mod: uint32(k)}))
		}
	}
	services = append(services,
		rule(lookup(mapServiceIPs)),
		rule(lookup(mapServiceIPs6)),
		rule(local, jump(chainNodePorts)),
	)
	// NodePorts, on the node's addresses but loopback: those DNATed by
	// the shared rules (see maxGroup) are masqueraded (the Cluster
	// policy), then DNATed as the cluster IPs are; the others go to their
	// chains.
	ret := VerdictStmt{Verdict{Kind: VerdictReturn}}
	nodePorts := []Rule{
		rule(MatchAddr{Dst: true, Prefix: loopback4}, ret),
		rule(MatchAddr{Dst: true, Prefix: loopback6}, ret),
	}
	for _, v6 := range []bool{false, true} {
		nodePorts = append(nodePorts, rule(MatchFamily{V6: v6}, matchSet(pick(v6, mapNodePorts, mapNodePorts6)), jump(chainMarkMasq)))
	}
	for _, v6 := range []bool{false, true} {
		for k := 1; k <= maxGroup; k++ {
			nodePorts = append(nodePorts, rule(DNATPortMap{Map: nodePortEndpointsMapName(v6, k), V6: v6, Mod: uint32(k)}))
		}
	}
	nodePorts = append(nodePorts, rule(lookup(mapServiceNodePorts)))
	post := []Rule{
		rule(MatchDNATed{}, matchSet(mapHairpin), jump(chainMarkMasq)),
		rule(MatchDNATed{}, matchSet(mapHairpin6), jump(chainMarkMasq)),
		rule(jump(chainMasquerading)),
	}
	hp := make([]Rule, 0, len(hostPorts))
	for _, h := range hostPorts {
		post = append(post, hairpinRule(podCIDR, h))
		hp = append(hp, hostPortRule(h))
	}
	post = append(post, rule(
		MatchAddr{Prefix: podCIDR},
		MatchAddr{Dst: true, Not: true, Prefix: podCIDR},
		Masquerade{FullyRandom: true},
	))

	return []chainDef{
		base(filterInput, ChainTypeFilter, HookInput, priorityFilter, endpointChecks...),
		base(filterForward, ChainTypeFilter, HookForward, priorityFilter, endpointChecks...),
		base(filterOutput, ChainTypeFilter, HookOutput, priorityFilter, endpointChecks...),
		base(natPrerouting, ChainTypeNAT, HookPrerouting, priorityDNAT,
			rule(local, jump(chainHostPorts)),
			rule(jump(chainServices)),
		),
		base(natOutput, ChainTypeNAT, HookOutput, priorityDNAT,
			rule(local, notLoopback4, jump(chainHostPorts)),
			rule(local, notLoopback6, jump(chainHostPorts)),
			rule(jump(chainServices)),
		),
		base(natPostrouting, ChainTypeNAT, HookPostrouting, prioritySNAT, post...),
		regular(chainServices, services...),
		regular(chainNodePorts, nodePorts...),
		regular(chainServiceEndpointsCheck,
			rule(lookup(mapNoEndpointServices)),
			rule(lookup(mapNoEndpointServices6)),
		),
		regular(chainNodePortEndpointsCheck,
			rule(local, notLoopback4, lookup(mapNoEndpointNodePorts)),
			rule(local, notLoopback6, lookup(mapNoEndpointNodePorts)),
		),
		regular(chainMarkMasq, rule(SetMark{Bit: masqBit})),
		regular(chainMasquerading,
			rule(MatchMark{Bit: masqBit}, VerdictStmt{Verdict{Kind: VerdictReturn}}),
			rule(SetMark{Bit: masqBit, Xor: true}),
			rule(Masquerade{FullyRandom: true}),
		),
		regular(chainReject, rule(Reject{})),
		regular(chainHostPorts, hp...),
	}
}

// hostPortRule is `[meta nfproto ipvX | ip daddr <hostIP>] <proto> dport
// <hostPort> dnat to <podIP>:<containerPort>`; the jump to hostports
// checks the destination is local (and, in output, not loopback).
func hostPortRule(h HostPort) Rule {
	var stmts []Stmt
	if h.HostIP.IsValid() {
		stmts = append(stmts, MatchAddr{Dst: true, Prefix: netip.PrefixFrom(h.HostIP, h.HostIP.BitLen())})
	} else {
		stmts = append(stmts, MatchFamily{V6: h.PodIP.Is6()})
	}
	return Rule{Stmts: append(stmts,
		MatchProtoPort{Protocol: h.Protocol, Port: h.HostPort},
		DNAT{Addr: h.PodIP, Port: h.ContainerPort},
	)}
}

// hairpinRule masquerades pods reaching a hostPort (HostPort's doc in
// hostport.go says why): `ip saddr <podCIDR> ip daddr <podIP> <proto> dport
// <containerPort> ct status dnat masquerade`; for a pod of the other
// family than the pod CIDR, the pod itself stands for the CIDR.
func hairpinRule(podCIDR netip.Prefix, h HostPort) Rule {
	pod := netip.PrefixFrom(h.PodIP, h.PodIP.BitLen())
	src := podCIDR
	if podCIDR.Addr().Is4() != h.PodIP.Is4() {
		src = pod
	}
	return Rule{Stmts: []Stmt{
		MatchAddr{Prefix: src},
		MatchAddr{Dst: true, Prefix: pod},
		MatchProtoPort{Protocol: h.Protocol, Port: h.ContainerPort},
		MatchDNATed{},
		Masquerade{},
	}}
}

// appendKey appends sp.String() to b without allocating.
func appendKey(b []byte, sp *servicemodel.ServicePort) []byte {
	b = append(b, sp.Namespace...)
	b = append(b, '/')
	b = append(b, sp.Name...)
	b = append(b, '/')
	for i := 0; i < len(sp.Protocol); i++ {
		c := sp.Protocol[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	b = append(b, '/')
	if sp.PortName != "" {
		return append(b, sp.PortName...)
	}
	return strconv.AppendUint(b, uint64(sp.Port), 10)
}

// equalServicePort reports whether a and b render the same.
func equalServicePort(a, b *servicemodel.ServicePort) bool {
	return a.Namespace == b.Namespace && a.Name == b.Name && a.PortName == b.PortName &&
		a.Protocol == b.Protocol && a.Port == b.Port && a.NodePort == b.NodePort &&
		a.AffinityTimeout == b.AffinityTimeout &&
		a.InternalLocal == b.InternalLocal && a.ExternalLocal == b.ExternalLocal &&
		slices.Equal(a.ClusterIPs, b.ClusterIPs) &&
		slices.Equal(a.ExternalIPs, b.ExternalIPs) &&
		slices.Equal(a.LoadBalancerIPs, b.LoadBalancerIPs) &&
		slices.Equal(a.Endpoints, b.Endpoints)
}

// keep is what the Table keeps of an applied ServicePort: sp itself when
// it is shared (ShareServicePorts), else a copy.
func (t *Table) keep(sp *servicemodel.ServicePort) *servicemodel.ServicePort {
	if t.shared {
		return sp
	}
	c := cloneServicePort(sp)
	return &c
}

// ShareServicePorts makes the Table keep the ServicePorts it applies as
// they are given (those of State.Services, and those PortChange.Port
// points to), not copies: for a caller that never changes a ServicePort
// after handing it over (the proxy's Index builds new ones), it saves a
// copy of every ServicePort and endpoint.
func (t *Table) ShareServicePorts() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.shared = true
}

// cloneServicePort copies sp and its slices, so the caller may reuse
// theirs.
func cloneServicePort(sp *servicemodel.ServicePort) servicemodel.ServicePort {
	c := *sp
	c.ClusterIPs = slices.Clip(slices.Clone(sp.ClusterIPs))
	c.ExternalIPs = slices.Clip(slices.Clone(sp.ExternalIPs))
	c.LoadBalancerIPs = slices.Clip(slices.Clone(sp.LoadBalancerIPs))
	c.Endpoints = slices.Clip(slices.Clone(sp.Endpoints))
	return c
}

// checkServicePort reports what makes sp impossible to render.
func checkServicePort(sp *servicemodel.ServicePort) error {
	if canonicalProtocol(sp.Protocol) == "" {
		return fmt.Errorf("service port %s: protocol %q: want TCP, UDP or SCTP", sp, sp.Protocol)
	}
	if sp.Port == 0 {
		return fmt.Errorf("service port %s: port is not set", sp)
	}
	for _, ips := range [][]netip.Addr{sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs} {
		for _, a := range ips {
			if !a.IsValid() {
				return fmt.Errorf("service port %s: an address is not set", sp)
			}
		}
	}
	for _, e := range sp.Endpoints {
		if !e.Addr.IsValid() || e.Port == 0 {
			return fmt.Errorf("service port %s: endpoint %s: address and port must be set", sp, netip.AddrPortFrom(e.Addr, e.Port))
		}
	}
	return nil
}

// canonicalProtocol returns TCP, UDP or SCTP for p in any case, or "".
func canonicalProtocol(p string) string {
	for _, c := range []string{"TCP", "UDP", "SCTP"} {
		if strings.EqualFold(p, c) {
			return c
		}
	}
	return ""
}
