package nft_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/netproxy/servicemodel"

	"github.com/outpost-edge/outpost/netproxy/nft"
	"github.com/outpost-edge/outpost/netproxy/nfttest"
)

// genService returns the i-th of many similar ServicePorts: a ClusterIP
// (every fourth with a NodePort) with five endpoints, two of them on this
// node.
func genService(i int) servicemodel.ServicePort {
	sp := servicemodel.ServicePort{
		Namespace:  fmt.Sprintf("ns%d", i%10),
		Name:       fmt.Sprintf("svc%d", i),
		Protocol:   "TCP",
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
		Port:       80,
	}
	if i%4 == 0 {
		sp.NodePort = uint16(30000 + i/4%2768)
	}
	for j := range 5 {
		n := i*5 + j
		sp.Endpoints = append(sp.Endpoints, servicemodel.Endpoint{
			Addr: netip.AddrFrom4([4]byte{10, 64 + byte(n>>16), byte(n >> 8), byte(n)}), Port: 8080,
			Ready: true, Serving: true, Local: j < 2,
		})
	}
	return sp
}

func genState(n int) nft.State {
	s := nft.State{PodCIDR: tsPodCIDR, HostPorts: tsHostPorts(), Services: make([]servicemodel.ServicePort, n)}
	for i := range n {
		s.Services[i] = genService(i)
	}
	return s
}

// withServices returns s with other services (sharing nothing with s).
func withServices(s nft.State, sps ...servicemodel.ServicePort) nft.State {
	s.Services = append(slices.Clip(s.Services), sps...)
	return s
}

// checkEqualsFull checks that f holds what a full sync of s on a fresh
// Fake gives, and that tb's counts agree.
func checkEqualsFull(t *testing.T, f *nfttest.Fake, tb *nft.Table, s nft.State) {
	t.Helper()
	fresh, ftb := synced(t, s)
	if got, want := f.Dump(), fresh.Dump(); got != want {
		t.Fatalf("incremental table differs from a full sync:\n%s", nfttest.LineDiff(want, got))
	}
	c1, r1, e1 := tb.Counts()
	c2, r2, e2 := ftb.Counts()
	if c1 != c2 || r1 != r2 || e1 != e2 {
		t.Errorf("Counts = %d, %d, %d; after a full sync %d, %d, %d", c1, r1, e1, c2, r2, e2)
	}
	cont, err := f.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(cont.Chains) != c1 {
		t.Errorf("Counts says %d chains, the table has %d", c1, len(cont.Chains))
	}
}

// TestSyncIncrementalCost: with N services applied, adding, changing and
// deleting one produces a Tx of the same size at N=10 and N=1000, which
// touches only that service's chains, sets and elements, and leaves the
// table a full sync would make.
func TestSyncIncrementalCost(t *testing.T) {
	extra := svcAffinity()
	extra.Name, extra.NodePort = "extra", 31999
	extra.ClusterIPs = []netip.Addr{ip("10.97.0.1")} // no genService has it
	extra.LoadBalancerIPs = []netip.Addr{ip("203.0.113.99")}
	changed := extra
	changed.Endpoints = []servicemodel.Endpoint{ready(tsRemote, 8080, false), ready(tsRemote2, 8080, false), ready(tsLocal2, 8080, true)}
	steps := []struct {
		name string
		sp   *servicemodel.ServicePort
	}{{"add", &extra}, {"change endpoints", &changed}, {"delete", nil}}

	var ops [2][]int
	for ni, n := range []int{10, 1000} {
		base := genState(n)
		f, tb := synced(t, base)
		for _, step := range steps {
			s := base
			if step.sp != nil {
				s = withServices(base, *step.sp)
			}
			before := f.Txs()
			got, err := tb.Sync(s)
			if err != nil {
				t.Fatalf("N=%d %s: %v", n, step.name, err)
			}
			if f.Txs() != before+1 {
				t.Errorf("N=%d %s: %d Txs, want 1", n, step.name, f.Txs()-before)
			}
			if got != len(f.Last()) {
				t.Errorf("N=%d %s: Sync says %d ops, the Tx had %d", n, step.name, got, len(f.Last()))
			}
			for _, op := range f.Last() {
				if !opTouches(op, extra) && !opTouches(op, changed) {
					t.Errorf("N=%d %s: op %s touches another service", n, step.name, op.String())
				}
			}
			ops[ni] = append(ops[ni], got)
			checkEqualsFull(t, f, tb, s)
		}
	}
	if !slices.Equal(ops[0], ops[1]) {
		t.Errorf("ops for add, change, delete: %v at N=10, %v at N=1000", ops[0], ops[1])
	}
	t.Logf("ops for add, change, delete: %v", ops[0])
}

// opTouches reports whether op is about sp's chains, sets or elements
// (its endpoints' hairpin elements included).
func opTouches(op nft.Op, sp servicemodel.ServicePort) bool {
	key := sp.String()
	switch op.Kind {
	case nft.OpAddElem, nft.OpDelElem:
		if op.Key.Addr2.IsValid() {
			return slices.ContainsFunc(sp.Endpoints, func(e servicemodel.Endpoint) bool { return e.Addr == op.Key.Addr })
		}
		addrs := slices.Concat(sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs)
		if op.Key.Addr.IsValid() {
			return slices.Contains(addrs, op.Key.Addr) && op.Key.Port == sp.Port
		}
		return op.Key.Port == sp.NodePort
	case nft.OpAddSet, nft.OpDelSet:
		return strings.Contains(op.Set.Name, key)
	}
	return strings.Contains(op.Chain.Name, key)
}

// TestSyncNoChange: a Sync with the same State applies nothing; a
// duplicate ServicePort is ignored (the first counts).
// TestSyncGroupedElementsOnly: adding, changing and deleting a ClusterIP
// Service with up to maxGroup endpoints, or the same with a NodePort or
// an external IP, sends map elements only, which the kernel does not check the table
// for; one that grows past maxGroup gets its own chains, and one that
// shrinks again loses them.
func TestSyncGroupedElementsOnly(t *testing.T) {
	t.Run("ClusterIP", func(t *testing.T) { testSyncGroupedElementsOnly(t, 0, nil) })
	t.Run("NodePort", func(t *testing.T) { testSyncGroupedElementsOnly(t, 32700, nil) })
	t.Run("external IP", func(t *testing.T) { testSyncGroupedElementsOnly(t, 0, []netip.Addr{ip("198.51.100.41")}) })
}

// testSyncGroupedElementsOnly is TestSyncGroupedElementsOnly for a
// Service with nodePort (0: none) and externalIPs.
func testSyncGroupedElementsOnly(t *testing.T, nodePort uint16, externalIPs []netip.Addr) {
	base := genState(40)
	extra := genService(41) // no NodePort
	extra.NodePort = nodePort
	extra.ExternalIPs = externalIPs
	extra.ClusterIPs = append(extra.ClusterIPs, ip("fd00:96::41"))
	extra.Endpoints = append(extra.Endpoints, ready(ip("fd00:42::41"), 8080, false))
	fewer := extra
	fewer.Endpoints = slices.Clone(extra.Endpoints[1:])
	replaced := extra
	replaced.Endpoints = slices.Clone(extra.Endpoints)
	replaced.Endpoints[2].Addr = ip("10.64.9.9")
	many := extra
	many.Endpoints = nil
	for i := range nft.MaxGroup + 1 {
		many.Endpoints = append(many.Endpoints, ready(netip.AddrFrom4([4]byte{10, 65, 0, byte(i)}), 8080, false))
	}
	f, tb := synced(t, base)
	for _, step := range []struct {
		name     string
		sp       *servicemodel.ServicePort
		elemOnly bool
	}{
		{"add", &extra, true},
		{"one endpoint fewer", &fewer, true},
		{"one more again", &extra, true},
		{"one endpoint replaced", &replaced, true},
		{"past maxGroup", &many, false},
		{"back under it", &extra, false},
		{"delete", nil, true},
	} {
		s := base
		if step.sp != nil {
			s = withServices(base, *step.sp)
		}
		if _, err := tb.Sync(s); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		chains := false
		for _, op := range f.Last() {
			if op.Kind != nft.OpAddElem && op.Kind != nft.OpDelElem {
				chains = true
				if step.elemOnly {
					t.Errorf("%s: op %s is not an element", step.name, op.String())
				}
			}
		}
		if !step.elemOnly && !chains {
			t.Errorf("%s: no chain changed", step.name)
		}
		want := 4 // the endpoint's element deleted and added, a hairpin element added and one deleted
		if nodePort != 0 {
			want += 2 // and its NodePort element
		}
		want += 2 * len(externalIPs) // and its external IPs' elements
		if step.name == "one endpoint replaced" && len(f.Last()) != want {
			t.Errorf("%s: %d ops, want %d (the endpoint's elements deleted and added, a hairpin element added and one deleted)", step.name, len(f.Last()), want)
		}
		checkEqualsFull(t, f, tb, s)
	}
}

func TestSyncNoChange(t *testing.T) {
	s := tsState()
	f, tb := synced(t, s)
	dup := svcClusterIP()
	dup.Endpoints = nil
	for _, s := range []nft.State{s, withServices(s, dup)} {
		ops, err := tb.Sync(s)
		if err != nil || ops != 0 {
			t.Errorf("Sync = %d, %v; want 0 ops", ops, err)
		}
	}
	if f.Txs() != 1 {
		t.Errorf("%d Txs, want 1", f.Txs())
	}
}

// TestSyncSharedAddress: two Services wanting the same external IP and
// port: the lower name has it, whatever their order, and the other takes
// over when it goes.
func TestSyncSharedAddress(t *testing.T) {
	a, b := svcExternalIP(), svcExternalIP()
	a.Name, b.Name = "a", "b"
	b.ClusterIPs = []netip.Addr{ip("10.96.0.33")}
	b.Endpoints = []servicemodel.Endpoint{ready(tsRemote2, 9090, false)}
	base := nft.State{PodCIDR: tsPodCIDR}
	viaExternal := func(f *nfttest.Fake) []string {
		return traceOutcomes(t, f, nfttest.Packet{Src: tsClient, Dst: ip("198.51.100.7"), Protocol: "TCP", Port: 80})
	}
	f, tb := synced(t, withServices(base, b, a))
	if got := viaExternal(f); !slices.Equal(got, []string{"dnat to 10.42.1.7:8080, masquerade"}) {
		t.Errorf("both: %q, want a's endpoint", got)
	}
	for _, s := range []nft.State{withServices(base, a, b), withServices(base, b), withServices(base, a, b), withServices(base, a)} {
		if _, err := tb.Sync(s); err != nil {
			t.Fatal(err)
		}
		checkEqualsFull(t, f, tb, s)
	}
	if _, err := tb.Sync(withServices(base, b)); err != nil {
		t.Fatal(err)
	}
	if got := viaExternal(f); !slices.Equal(got, []string{"dnat to 10.42.1.9:9090, masquerade"}) {
		t.Errorf("b alone: %q, want b's endpoint", got)
	}
}

// failing is a Ruleset whose next Apply or List fails when told to.
type failing struct {
	*nfttest.Fake
	failApply, failList bool
	lists               int
}

var errInjected = errors.New("injected failure")

func (r *failing) Apply(tx *nft.Tx) error {
	if r.failApply {
		r.failApply = false
		return errInjected
	}
	return r.Fake.Apply(tx)
}

func (r *failing) List() (nft.Contents, error) {
	r.lists++
	if r.failList {
		r.failList = false
		return nft.Contents{}, errInjected
	}
	return r.Fake.List()
}

// TestSyncAfterFailure: a failed apply (or list) changes nothing, and the
// next Sync is full (it lists the table) and succeeds.
func TestSyncAfterFailure(t *testing.T) {
	r := &failing{Fake: nfttest.NewFake()}
	tb := nft.NewTable(r)
	base := tsState()
	if _, err := tb.Sync(base); err != nil {
		t.Fatal(err)
	}
	next := withServices(base, genService(1))
	next.Services[0].Endpoints = next.Services[0].Endpoints[:1]

	before := r.Dump()
	r.failApply = true
	if _, err := tb.Sync(next); !errors.Is(err, errInjected) {
		t.Fatalf("Sync = %v, want the injected error", err)
	}
	if r.Dump() != before {
		t.Fatal("a failed apply changed the table")
	}
	lists := r.lists
	if _, err := tb.Sync(next); err != nil {
		t.Fatal(err)
	}
	if r.lists != lists+1 {
		t.Errorf("the Sync after a failure listed the table %d times, want once (a full sync)", r.lists-lists)
	}
	checkEqualsFull(t, r.Fake, tb, next)

	r.failList = true
	tb.Resync()
	if _, err := tb.Sync(base); !errors.Is(err, errInjected) {
		t.Fatalf("Sync = %v, want the injected error", err)
	}
	if _, err := tb.Sync(base); err != nil {
		t.Fatal(err)
	}
	checkEqualsFull(t, r.Fake, tb, base)

	// An incremental Sync does not list.
	lists = r.lists
	if _, err := tb.Sync(next); err != nil {
		t.Fatal(err)
	}
	if r.lists != lists {
		t.Error("an incremental Sync listed the table")
	}
}

// TestFullSyncCleansTable: a full sync over a table holding what an older
// outpost (nat.go, a base chain of another priority) and someone else left
// there keeps only what it wants, and keeps the contents of wanted
// affinity sets.
func TestFullSyncCleansTable(t *testing.T) {
	f := nfttest.NewFake()
	tx := &nft.Tx{}
	tx.AddChain(nft.Chain{Name: nft.NatPrerouting, Base: &nft.Base{Type: nft.ChainTypeNAT, Hook: nft.HookPrerouting, Priority: nft.PriorityDNAT}})
	tx.AddChain(nft.Chain{Name: nft.FilterInput, Base: &nft.Base{Type: nft.ChainTypeFilter, Hook: nft.HookInput, Priority: 0}}) // another priority
	tx.AddChain(nft.Chain{Name: "stray"})
	tx.AddChain(nft.Chain{Name: "service-AAAAAAAA-ns/gone/tcp/80"})
	tx.AddSet(nft.AddrSet{Name: "affinity-AAAAAAAA-ns/gone/tcp/80__10.0.0.1/80", Timeout: time.Minute})
	tx.AddMap(nft.Map{Name: "stray-map", Key: nft.KeyProtoPort})
	tx.AddMap(nft.Map{Name: nft.MapNameServiceIPs, Key: nft.KeyAddr4ProtoPort})
	tx.AddRule("stray", nft.MapLookup{Map: "stray-map", Key: nft.KeyProtoPort})
	tx.AddRule("service-AAAAAAAA-ns/gone/tcp/80", nft.SetLookup{Set: "affinity-AAAAAAAA-ns/gone/tcp/80__10.0.0.1/80"}, nft.VerdictStmt{Verdict: nft.Goto("stray")})
	tx.AddRule(nft.NatPrerouting, nft.MatchProtoPort{Protocol: "TCP", Port: 1}, nft.DNAT{Addr: tsPod, Port: 1})
	tx.AddElem(nft.Map{Name: nft.MapNameServiceIPs, Key: nft.KeyAddr4ProtoPort}, nft.MapKey{Addr: ip("10.96.0.1"), Protocol: "TCP", Port: 1}, nft.Goto("service-AAAAAAAA-ns/gone/tcp/80"))
	if err := f.Apply(tx); err != nil {
		t.Fatal(err)
	}
	tb := nft.NewTable(f)
	s := tsState()
	if _, err := tb.Sync(s); err != nil {
		t.Fatal(err)
	}
	checkEqualsFull(t, f, tb, s)

	// Session state survives a full sync.
	sticky := affinitySetOf(svcAffinity(), tsRemote, 8080)
	if err := f.AddSetElement(sticky, tsPod); err != nil {
		t.Fatal(err)
	}
	for _, tb := range []*nft.Table{tb, nft.NewTable(f)} { // a Resync, and a restart
		tb.Resync()
		if _, err := tb.Sync(s); err != nil {
			t.Fatal(err)
		}
		got := traceOutcomes(t, f, nfttest.Packet{Src: tsPod, Dst: ip("10.96.0.40"), Protocol: "TCP", Port: 80})
		if len(got) != 1 {
			t.Errorf("after a full sync the client is not stuck any more: %q", got)
		}
	}
}

// TestSyncAffinityTimeoutChange: a new affinity timeout re-creates the
// sets, incrementally and in a full sync.
func TestSyncAffinityTimeoutChange(t *testing.T) {
	s := tsState()
	f, tb := synced(t, s)
	for i, full := range []bool{false, true, false} {
		s = withServices(nft.State{PodCIDR: s.PodCIDR, HostPorts: s.HostPorts}, s.Services...)
		for j := range s.Services {
			if s.Services[j].AffinityTimeout > 0 {
				s.Services[j].AffinityTimeout = time.Duration(i+1) * time.Minute
			}
		}
		if full {
			tb.Resync()
		}
		if _, err := tb.Sync(s); err != nil {
			t.Fatalf("full %v: %v", full, err)
		}
		checkEqualsFull(t, f, tb, s)
	}
}

// TestSyncPodCIDRChange: another pod CIDR is applied (in full).
func TestSyncPodCIDRChange(t *testing.T) {
	s := tsState()
	f, tb := synced(t, s)
	s.PodCIDR = netip.MustParsePrefix("10.42.8.0/24")
	if _, err := tb.Sync(s); err != nil {
		t.Fatal(err)
	}
	checkEqualsFull(t, f, tb, s)
}

// TestSyncRandom applies a fixed-seed sequence of random States
// incrementally; after each the table equals a full sync's.
func TestSyncRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	f := nfttest.NewFake()
	tb := nft.NewTable(f)
	steps := 300
	if testing.Short() {
		steps = 60
	}
	for step := range steps {
		s := randomState(rng)
		if rng.IntN(20) == 0 {
			tb.Resync()
		}
		if _, err := tb.Sync(s); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		checkEqualsFull(t, f, tb, s)
	}
}

// TestUpdateRandom: through a fixed-seed sequence of random States,
// Update given the ServicePorts of each (all of them, duplicates
// included, some changing nothing) and those gone since the last leaves
// the table equal to a full sync's.
func TestUpdateRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	f := nfttest.NewFake()
	tb := nft.NewTable(f)
	if _, err := tb.Update(nil, nil); err == nil {
		t.Fatalf("Update before the first Sync: no error")
	}
	var prev nft.State
	for step := range 200 {
		s := randomState(rng)
		if step == 0 || rng.IntN(20) == 0 {
			if _, err := tb.Sync(s); err != nil {
				t.Fatalf("step %d: sync: %v", step, err)
			}
			checkEqualsFull(t, f, tb, s)
			prev = s
			continue
		}
		var changes []servicemodel.PortChange
		cur := map[string]bool{}
		for i := range s.Services {
			k := s.Services[i].String()
			cur[k] = true
			changes = append(changes, servicemodel.PortChange{Key: k, Port: &s.Services[i]})
		}
		for _, sp := range prev.Services {
			if k := sp.String(); !cur[k] {
				changes = append(changes, servicemodel.PortChange{Key: k})
				cur[k] = true
			}
		}
		rng.Shuffle(len(changes), func(i, j int) { changes[i], changes[j] = changes[j], changes[i] })
		if _, err := tb.Update(s.HostPorts, changes); err != nil {
			t.Fatalf("step %d: update: %v", step, err)
		}
		checkEqualsFull(t, f, tb, s)
		prev = s
	}
	bad := servicemodel.ServicePort{Namespace: "ns", Name: "x", Protocol: "TCP", Port: 80}
	if _, err := tb.Update(nil, []servicemodel.PortChange{{Key: "ns/y/tcp/80", Port: &bad}}); err == nil || !strings.Contains(err.Error(), "ns/x/tcp/80") {
		t.Errorf("Update with a key that is not the port's: %v", err)
	}
}

// randomState draws a State from small pools of names, addresses and
// ports, so that services come, go, change and collide.
func randomState(rng *rand.Rand) nft.State {
	pick := func(n int) bool { return rng.IntN(n) == 0 }
	addrs := []netip.Addr{ip("10.42.0.5"), ip("10.42.0.6"), ip("10.42.1.7"), ip("10.42.1.9"), ip("fd00:42::5"), ip("fd00:42::7")}
	s := nft.State{PodCIDR: tsPodCIDR}
	for _, hp := range tsHostPorts() {
		if pick(2) {
			s.HostPorts = append(s.HostPorts, hp)
		}
	}
	for i := range 12 {
		if pick(4) {
			continue
		}
		sp := servicemodel.ServicePort{
			Namespace: "ns", Name: fmt.Sprintf("s%d", i), Protocol: []string{"TCP", "UDP", "SCTP"}[i%3],
			Port: uint16(80 + rng.IntN(2)),
		}
		if !pick(8) {
			sp.ClusterIPs = append(sp.ClusterIPs, netip.AddrFrom4([4]byte{10, 96, 0, byte(rng.IntN(16))}))
		}
		if pick(3) {
			sp.ClusterIPs = append(sp.ClusterIPs, netip.AddrFrom16([16]byte{0xfd, 0, 0x96, 15: byte(rng.IntN(16))}))
		}
		if pick(3) {
			sp.NodePort = uint16(30000 + rng.IntN(6))
		}
		if pick(4) {
			sp.ExternalIPs = []netip.Addr{netip.AddrFrom4([4]byte{198, 51, 100, byte(rng.IntN(3))})}
		}
		if pick(4) {
			sp.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{203, 0, 113, byte(rng.IntN(3))}), ip("2001:db8::99")}
		}
		sp.AffinityTimeout = []time.Duration{0, 0, 10 * time.Second, 3 * time.Hour}[rng.IntN(4)]
		sp.InternalLocal, sp.ExternalLocal = pick(4), pick(3)
		for _, a := range addrs {
			if pick(2) {
				continue
			}
			sp.Endpoints = append(sp.Endpoints, servicemodel.Endpoint{
				Addr: a, Port: uint16(8080 + rng.IntN(2)),
				Ready: !pick(3), Serving: !pick(3), Terminating: pick(3),
				Local: a.Is6() || a.As4()[2] == 0,
			})
		}
		s.Services = append(s.Services, sp)
		if pick(10) {
			s.Services = append(s.Services, sp) // a duplicate
		}
	}
	rng.Shuffle(len(s.Services), func(i, j int) { s.Services[i], s.Services[j] = s.Services[j], s.Services[i] })
	return s
}

// TestTableCounts: Counts agrees with the table.
func TestTableCounts(t *testing.T) {
	f, tb := synced(t, tsState())
	chains, rules, elements := tb.Counts()
	wantChains, wantRules, wantElems := f.Counts()
	if chains != wantChains || rules != wantRules || elements != wantElems {
		t.Errorf("Counts = %d, %d, %d; the table has %d chains, %d rules, %d elements",
			chains, rules, elements, wantChains, wantRules, wantElems)
	}
}

// discard is a Ruleset that applies nothing.
type discard struct{}

func (discard) Apply(*nft.Tx) error         { return nil }
func (discard) List() (nft.Contents, error) { return nft.Contents{}, nil }

// TestTableMemory: what a Table keeps for 10,000 services of 5 endpoints
// each stays within a budget.
func TestTableMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 10,000 services")
	}
	const budget = 12 << 20
	s := genState(10000)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tb := nft.NewTable(discard{})
	if _, err := tb.Sync(s); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	live := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	runtime.KeepAlive(tb)
	runtime.KeepAlive(s)
	t.Logf("a Table of 10,000 services holds %.1f MiB", float64(live)/(1<<20))
	if live > budget {
		t.Errorf("a Table of 10,000 services holds %d bytes, budget %d", live, budget)
	}
}

// BenchmarkTableColdSync: the first Sync of N services (5 endpoints each)
// on the Fake. table-ns/op is the Table's share, the rest the Fake's.
func BenchmarkTableColdSync(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			s := genState(n)
			b.ReportAllocs()
			var ops int
			var apply time.Duration
			for b.Loop() {
				rs := &nfttest.Timed{Ruleset: nfttest.NewFake()}
				got, err := nft.NewTable(rs).Sync(s)
				if err != nil {
					b.Fatal(err)
				}
				ops += got
				apply += rs.Applying
			}
			b.ReportMetric(float64(ops)/float64(b.N), "txops/op")
			b.ReportMetric(float64(ops)/b.Elapsed().Seconds(), "ops/s")
			b.ReportMetric(float64((b.Elapsed()-apply).Nanoseconds())/float64(b.N), "table-ns/op")
		})
	}
}

// BenchmarkTableUpdateOne: with N services applied, one op is three
// Syncs: add a Service, change its endpoints, delete it. table-ns/op is
// the Table's share, the rest the Fake's (which copies its indexes and
// walks the whole table on every Apply).
func BenchmarkTableUpdateOne(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			base := genState(n)
			extra := genService(n + 1)
			changed := extra
			changed.Endpoints = slices.Clone(extra.Endpoints[1:])
			added, modified := withServices(base, extra), withServices(base, changed)
			rs := &nfttest.Timed{Ruleset: nfttest.NewFake()}
			tb := nft.NewTable(rs)
			if _, err := tb.Sync(base); err != nil {
				b.Fatal(err)
			}
			rs.Applying = 0
			b.ReportAllocs()
			var ops int
			for b.Loop() {
				for _, s := range []nft.State{added, modified, base} {
					got, err := tb.Sync(s)
					if err != nil {
						b.Fatal(err)
					}
					ops += got
				}
			}
			b.ReportMetric(float64(ops)/float64(b.N), "txops/op")
			b.ReportMetric(float64(ops)/b.Elapsed().Seconds(), "ops/s")
			b.ReportMetric(float64((b.Elapsed()-rs.Applying).Nanoseconds())/float64(b.N), "table-ns/op")
		})
	}
}

// TestE2ETableNetlink: the Table's full and incremental Txs apply to the
// kernel (in a fresh netns) and leave there what they leave in the Fake.
func TestE2ETableNetlink(t *testing.T) {
	ns := nfttest.NetNS(t)
	tb := nft.NewTable(nft.NewNetlink(ns))
	rng := rand.New(rand.NewPCG(3, 4))
	steps := 40
	if testing.Short() {
		steps = 10
	}
	for step := range steps {
		s := tsState()
		if step > 0 {
			s = randomState(rng)
		}
		if step == steps/2 {
			tb.Resync()
		}
		if _, err := tb.Sync(s); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		fresh, _ := synced(t, s)
		if got, want := nfttest.Normalize(nfttest.ListTable(t, ns)), fresh.Dump(); got != want {
			t.Fatalf("step %d: kernel differs from a full sync on the Fake (nft %s):\n%s", step, nfttest.NFTVersion(), nfttest.LineDiff(want, got))
		}
	}
}
