package nfttest

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/outpost-edge/outpost/netproxy/nft"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

var (
	mpNatPre  = nft.Chain{Name: "nat-prerouting", Base: &nft.Base{Type: nft.ChainTypeNAT, Hook: nft.HookPrerouting, Priority: -100}}
	mpNatOut  = nft.Chain{Name: "nat-output", Base: &nft.Base{Type: nft.ChainTypeNAT, Hook: nft.HookOutput, Priority: -100}}
	mpNatPost = nft.Chain{Name: "nat-postrouting", Base: &nft.Base{Type: nft.ChainTypeNAT, Hook: nft.HookPostrouting, Priority: 100}}
	mpFiltIn  = nft.Chain{Name: "filter-input", Base: &nft.Base{Type: nft.ChainTypeFilter, Hook: nft.HookInput, Priority: 0}}
	mpFiltFwd = nft.Chain{Name: "filter-forward", Base: &nft.Base{Type: nft.ChainTypeFilter, Hook: nft.HookForward, Priority: 0}}
	mpFiltOut = nft.Chain{Name: "filter-output", Base: &nft.Base{Type: nft.ChainTypeFilter, Hook: nft.HookOutput, Priority: 0}}

	mpSvc4      = nft.Map{Name: "service-ips", Key: nft.KeyAddr4ProtoPort}
	mpSvc6      = nft.Map{Name: "service-ips6", Key: nft.KeyAddr6ProtoPort}
	mpNodePorts = nft.Map{Name: "service-nodeports", Key: nft.KeyProtoPort}

	mpClusterIP  = netip.MustParseAddr("10.96.0.10")
	mpClusterIP6 = netip.MustParseAddr("fd00:96::10")
	mpEP1        = netip.MustParseAddr("10.42.0.5")
	mpEP2        = netip.MustParseAddr("10.42.1.7")
	mpEP6        = netip.MustParseAddr("fd00:42::5")
)

// mpMarkMasq is the mark bit that asks nat-postrouting to masquerade.
const mpMarkMasq = 0x4000

// miniProxy is a hand-built kube-proxy-like ruleset: ClusterIP
// 10.96.0.10:53/UDP and :80/TCP dispatch through a map to service chains;
// the TCP one balances over two endpoints (with session affinity), the UDP
// one has no endpoints and rejects; a NodePort and an IPv6 ClusterIP go to
// the TCP service; traffic from outside the pod network is marked for
// masquerade.
func miniProxy() *nft.Tx {
	tx := &nft.Tx{}
	for _, c := range []nft.Chain{mpNatPre, mpNatOut, mpNatPost, mpFiltIn, mpFiltFwd, mpFiltOut} {
		tx.AddChain(c)
	}
	aff := nft.AddrSet{Name: "affinity-web-ep1", Timeout: 3 * time.Hour}
	aff6 := nft.AddrSet{Name: "affinity-web-ep6", V6: true, Timeout: 90 * time.Second}
	tx.AddSet(aff)
	tx.AddSet(aff6)
	for _, m := range []nft.Map{mpSvc4, mpSvc6, mpNodePorts} {
		tx.AddMap(m)
	}
	for _, c := range []string{"mark-for-masquerade", "services", "reject-services", "svc-web", "ep-web-1", "ep-web-2", "ep-web-6", "svc-dns-reject"} {
		tx.AddChain(nft.Chain{Name: c})
	}
	tx.AddRule("mark-for-masquerade", nft.SetMark{Bit: mpMarkMasq})
	tx.AddRule("svc-web", nft.MatchAddr{Not: true, Prefix: netip.MustParsePrefix("10.42.0.0/16")}, nft.VerdictStmt{Verdict: nft.Jump("mark-for-masquerade")})
	tx.AddRule("svc-web", nft.SetLookup{Set: aff.Name}, nft.VerdictStmt{Verdict: nft.Goto("ep-web-1")})
	tx.AddRule("svc-web", nft.SetLookup{Set: aff6.Name, V6: true}, nft.VerdictStmt{Verdict: nft.Goto("ep-web-6")})
	tx.AddRule("svc-web", nft.MatchFamily{}, nft.MatchRandom{Mod: 2}, nft.VerdictStmt{Verdict: nft.Goto("ep-web-1")})
	tx.AddRule("svc-web", nft.MatchFamily{}, nft.VerdictStmt{Verdict: nft.Goto("ep-web-2")})
	tx.AddRule("svc-web", nft.MatchFamily{V6: true}, nft.VerdictStmt{Verdict: nft.Goto("ep-web-6")})
	tx.AddRule("ep-web-1", nft.MatchAddr{Prefix: netip.PrefixFrom(mpEP1, 32)}, nft.VerdictStmt{Verdict: nft.Jump("mark-for-masquerade")})
	tx.AddRule("ep-web-1", nft.SetUpdate{Set: aff.Name})
	tx.AddRule("ep-web-1", nft.MatchProtoPort{Protocol: "TCP"}, nft.DNAT{Addr: mpEP1, Port: 8080})
	tx.AddRule("ep-web-2", nft.MatchFamily{}, nft.MatchProtoPort{Protocol: "TCP"}, nft.DNAT{Addr: mpEP2, Port: 8080})
	tx.AddRule("ep-web-6", nft.SetUpdate{Set: aff6.Name, V6: true})
	tx.AddRule("ep-web-6", nft.MatchProtoPort{Protocol: "TCP"}, nft.DNAT{Addr: mpEP6, Port: 8080})
	tx.AddRule("svc-dns-reject", nft.Reject{})
	tx.AddRule("services", nft.MapLookup{Map: mpSvc4.Name, Key: mpSvc4.Key})
	tx.AddRule("services", nft.MapLookup{Map: mpSvc6.Name, Key: mpSvc6.Key})
	tx.AddRule("services", nft.MatchAddrType{Dst: true}, nft.MapLookup{Map: mpNodePorts.Name, Key: mpNodePorts.Key})
	tx.AddRule("reject-services", nft.MatchFamily{}, nft.MatchAddr{Dst: true, Prefix: netip.PrefixFrom(mpClusterIP, 32)}, nft.MatchProtoPort{Protocol: "UDP", Port: 53}, nft.VerdictStmt{Verdict: nft.Goto("svc-dns-reject")})
	tx.Ops = append(tx.Ops, nft.Op{Kind: nft.OpAddRule, Chain: nft.Chain{Name: mpNatPre.Name}, Rule: nft.Rule{Stmts: []nft.Stmt{nft.VerdictStmt{Verdict: nft.Jump("services")}}, Comment: "service dispatch"}})
	tx.AddRule(mpNatOut.Name, nft.VerdictStmt{Verdict: nft.Jump("services")})
	tx.AddRule(mpNatPost.Name, nft.MatchMark{Bit: mpMarkMasq}, nft.VerdictStmt{Verdict: nft.Verdict{Kind: nft.VerdictReturn}})
	tx.AddRule(mpNatPost.Name, nft.SetMark{Bit: mpMarkMasq, Xor: true})
	tx.AddRule(mpNatPost.Name, nft.MatchDNATed{}, nft.Masquerade{FullyRandom: true})
	tx.AddRule(mpFiltIn.Name, nft.VerdictStmt{Verdict: nft.Jump("reject-services")})
	tx.AddRule(mpFiltFwd.Name, nft.VerdictStmt{Verdict: nft.Jump("reject-services")})
	tx.AddRule(mpFiltOut.Name, nft.VerdictStmt{Verdict: nft.Jump("reject-services")})
	tx.AddElem(mpSvc4, nft.MapKey{Addr: mpClusterIP, Protocol: "TCP", Port: 80}, nft.Goto("svc-web"))
	tx.AddElem(mpSvc6, nft.MapKey{Addr: mpClusterIP6, Protocol: "TCP", Port: 80}, nft.Goto("svc-web"))
	tx.AddElem(mpNodePorts, nft.MapKey{Protocol: "TCP", Port: 30080}, nft.Goto("svc-web"))
	tx.AddElem(mpNodePorts, nft.MapKey{Protocol: "UDP", Port: 30053}, nft.Verdict{Kind: nft.VerdictDrop})
	return tx
}

func checkFakeGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("differs from %s:\n%s", path, got)
	}
}

func TestFakeDumpGolden(t *testing.T) {
	f := NewFake()
	if err := f.Apply(miniProxy()); err != nil {
		t.Fatal(err)
	}
	checkFakeGolden(t, "fake-miniproxy.golden", f.Dump())
	c, err := f.List()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"affinity-web-ep1", "affinity-web-ep6"}; !slices.Equal(c.Sets, want) {
		t.Errorf("List().Sets = %v, want %v", c.Sets, want)
	}
	if want := []string{"service-ips", "service-ips6", "service-nodeports"}; !slices.Equal(c.Maps, want) {
		t.Errorf("List().Maps = %v, want %v", c.Maps, want)
	}
	if len(c.Chains) != 14 {
		t.Errorf("List().Chains = %v, want 14", c.Chains)
	}
	if f.Txs() != 1 || f.Ops() != len(miniProxy().Ops) || len(f.Last()) != f.Ops() {
		t.Errorf("Txs, Ops, Last = %d, %d, %d", f.Txs(), f.Ops(), len(f.Last()))
	}
}

func TestFakeEmpty(t *testing.T) {
	f := NewFake()
	if err := f.Apply(&nft.Tx{}); err != nil {
		t.Fatal(err)
	}
	if got := f.Dump(); got != "" {
		t.Errorf("Dump of no table = %q", got)
	}
	c, err := f.List()
	if err != nil || len(c.Chains)+len(c.Maps)+len(c.Sets) != 0 {
		t.Errorf("List of no table = %+v, %v", c, err)
	}
	tx := &nft.Tx{}
	tx.DelTable() // a missing table is not an error
	tx.AddMap(mpNodePorts)
	if err := f.Apply(tx); err != nil {
		t.Fatal(err)
	}
	if f.Txs() != 1 || f.Ops() != 2 {
		t.Errorf("Txs, Ops = %d, %d, want 1, 2", f.Txs(), f.Ops())
	}
	tx = &nft.Tx{}
	tx.DelTable()
	if err := f.Apply(tx); err != nil {
		t.Fatal(err)
	}
	if got := f.Dump(); got != "" {
		t.Errorf("Dump after delete table = %q", got)
	}
}

// TestFakeErrors: each Tx fails, names the op, and leaves the fake as it
// was.
func TestFakeErrors(t *testing.T) {
	drop := nft.Verdict{Kind: nft.VerdictDrop}
	for _, tc := range []struct {
		name  string
		tx    func(tx *nft.Tx)
		errno unix.Errno
		want  string // in the error
	}{
		{"rule in missing chain", func(tx *nft.Tx) { tx.AddRule("nope", nft.Reject{}) }, unix.ENOENT, "op 0 (add rule to chain nope)"},
		{"jump to missing chain", func(tx *nft.Tx) { tx.AddRule("svc-web", nft.VerdictStmt{Verdict: nft.Jump("nope")}) }, unix.ENOENT, `target chain "nope"`},
		{"goto base chain", func(tx *nft.Tx) { tx.AddRule("svc-web", nft.VerdictStmt{Verdict: nft.Goto(mpNatPre.Name)}) }, unix.EOPNOTSUPP, "base chain"},
		{"numgen modulus 0", func(tx *nft.Tx) {
			tx.AddRule("svc-web", nft.MatchRandom{}, nft.VerdictStmt{Verdict: nft.Goto("ep-web-1")})
		}, unix.ERANGE, "numgen"},
		{"vmap to missing map", func(tx *nft.Tx) { tx.AddRule("services", nft.MapLookup{Map: "nope", Key: nft.KeyProtoPort}) }, unix.ENOENT, "nope"},
		{"vmap of other key type", func(tx *nft.Tx) { tx.AddRule("services", nft.MapLookup{Map: mpSvc4.Name, Key: nft.KeyProtoPort}) }, unix.EINVAL, "key"},
		{"missing set", func(tx *nft.Tx) { tx.AddRule("svc-web", nft.SetLookup{Set: "nope"}) }, unix.ENOENT, "nope"},
		{"set update of other family", func(tx *nft.Tx) { tx.AddRule("svc-web", nft.SetUpdate{Set: "affinity-web-ep1", V6: true}) }, unix.EINVAL, "ipv4_addr"},
		{"statement after verdict", func(tx *nft.Tx) {
			tx.AddRule("svc-web", nft.VerdictStmt{Verdict: nft.Goto("ep-web-1")}, nft.SetMark{Bit: 1})
		}, unix.EINVAL, "never run"},
		{"pointer statement", func(tx *nft.Tx) { tx.AddRule("svc-web", &nft.MatchDNATed{}) }, unix.EOPNOTSUPP, "*nft.MatchDNATed"},
		{"bad protocol", func(tx *nft.Tx) { tx.AddRule("svc-web", nft.MatchProtoPort{Protocol: "ICMP"}) }, unix.EINVAL, "ICMP"},
		{"dnat port 0", func(tx *nft.Tx) { tx.AddRule("ep-web-1", nft.DNAT{Addr: mpEP1}) }, unix.EINVAL, "port 0"},
		{"flush missing chain", func(tx *nft.Tx) { tx.FlushChain("nope") }, unix.ENOENT, "flush chain nope"},
		{"delete missing chain", func(tx *nft.Tx) { tx.DelChain("nope") }, unix.ENOENT, "delete chain nope"},
		{"delete chain with rules", func(tx *nft.Tx) { tx.DelChain("ep-web-2") }, unix.EBUSY, "rules"},
		{"delete chain jumped to", func(tx *nft.Tx) { tx.FlushChain("ep-web-1"); tx.DelChain("ep-web-1") }, unix.EBUSY, "op 1 (delete chain ep-web-1)"},
		{"delete chain in a map", func(tx *nft.Tx) {
			tx.FlushChain("services")
			tx.FlushChain("svc-web")
			tx.DelChain("svc-web")
		}, unix.EBUSY, "target of 3"},
		{"delete missing map", func(tx *nft.Tx) { tx.DelMap(nft.Map{Name: "nope", Key: nft.KeyProtoPort}) }, unix.ENOENT, "nope"},
		{"delete map in use", func(tx *nft.Tx) { tx.DelMap(mpSvc4) }, unix.EBUSY, "used by 1 rules"},
		{"delete missing set", func(tx *nft.Tx) { tx.DelSet(nft.AddrSet{Name: "nope"}) }, unix.ENOENT, "nope"},
		{"delete set in use", func(tx *nft.Tx) { tx.DelSet(nft.AddrSet{Name: "affinity-web-ep1"}) }, unix.EBUSY, "used by"},
		{"element in missing map", func(tx *nft.Tx) {
			tx.AddElem(nft.Map{Name: "nope", Key: nft.KeyProtoPort}, nft.MapKey{Protocol: "TCP", Port: 1}, drop)
		}, unix.ENOENT, "nope"},
		{"v6 key in v4 map", func(tx *nft.Tx) { tx.AddElem(mpSvc4, nft.MapKey{Addr: mpClusterIP6, Protocol: "TCP", Port: 1}, drop) }, unix.EINVAL, "IPv4"},
		{"v4 key in v6 map", func(tx *nft.Tx) { tx.AddElem(mpSvc6, nft.MapKey{Addr: mpClusterIP, Protocol: "TCP", Port: 1}, drop) }, unix.EINVAL, "IPv6"},
		{"address in port map", func(tx *nft.Tx) {
			tx.AddElem(mpNodePorts, nft.MapKey{Addr: mpClusterIP, Protocol: "TCP", Port: 1}, drop)
		}, unix.EINVAL, "no address"},
		{"op key type differs", func(tx *nft.Tx) {
			tx.AddElem(nft.Map{Name: mpNodePorts.Name, Key: nft.KeyAddr4ProtoPort}, nft.MapKey{Addr: mpClusterIP, Protocol: "TCP", Port: 1}, drop)
		}, unix.EINVAL, "op says"},
		{"element to missing chain", func(tx *nft.Tx) { tx.AddElem(mpNodePorts, nft.MapKey{Protocol: "TCP", Port: 1}, nft.Goto("nope")) }, unix.ENOENT, "nope"},
		{"element with other verdict", func(tx *nft.Tx) { tx.AddElem(mpNodePorts, nft.MapKey{Protocol: "tcp", Port: 30080}, drop) }, unix.EEXIST, "goto svc-web"},
		{"delete missing element", func(tx *nft.Tx) { tx.DelElem(mpNodePorts, nft.MapKey{Protocol: "TCP", Port: 1}) }, unix.ENOENT, "delete element tcp . 1 from map service-nodeports"},
		{"map of other key type", func(tx *nft.Tx) { tx.AddMap(nft.Map{Name: mpNodePorts.Name, Key: nft.KeyAddr4ProtoPort}) }, unix.EEXIST, "exists"},
		{"map named like a set", func(tx *nft.Tx) { tx.AddMap(nft.Map{Name: "affinity-web-ep1", Key: nft.KeyProtoPort}) }, unix.EEXIST, "set"},
		{"set of other family", func(tx *nft.Tx) { tx.AddSet(nft.AddrSet{Name: "affinity-web-ep1", V6: true, Timeout: 3 * time.Hour}) }, unix.EEXIST, "ipv4_addr"},
		{"set with other timeout", func(tx *nft.Tx) { tx.AddSet(nft.AddrSet{Name: "affinity-web-ep1", Timeout: time.Hour}) }, unix.EEXIST, "timeout"},
		{"base chain with other priority", func(tx *nft.Tx) {
			tx.AddChain(nft.Chain{Name: mpNatPre.Name, Base: &nft.Base{Type: nft.ChainTypeNAT, Hook: nft.HookPrerouting, Priority: -99}})
		}, unix.EOPNOTSUPP, "priority -100"},
		{"regular chain made base", func(tx *nft.Tx) { tx.AddChain(nft.Chain{Name: "svc-web", Base: mpNatOut.Base}) }, unix.EEXIST, "regular"},
		{"nat forward", func(tx *nft.Tx) {
			tx.AddChain(nft.Chain{Name: "x", Base: &nft.Base{Type: nft.ChainTypeNAT, Hook: nft.HookForward}})
		}, unix.EOPNOTSUPP, "forward"},
		{"empty name", func(tx *nft.Tx) { tx.AddChain(nft.Chain{}) }, unix.EINVAL, "empty"},
		{"dnat reachable from postrouting", func(tx *nft.Tx) { tx.AddRule(mpNatPost.Name, nft.VerdictStmt{Verdict: nft.Jump("ep-web-2")}) }, unix.EOPNOTSUPP, "dnat"},
		{"masquerade reachable from prerouting", func(tx *nft.Tx) { tx.AddRule("ep-web-2", nft.Masquerade{}) }, unix.EOPNOTSUPP, "masquerade"},
		{"reject reachable from nat", func(tx *nft.Tx) {
			tx.AddElem(mpNodePorts, nft.MapKey{Protocol: "UDP", Port: 1}, nft.Goto("svc-dns-reject"))
		}, unix.EOPNOTSUPP, "reject"},
		{"loop", func(tx *nft.Tx) { tx.AddRule("mark-for-masquerade", nft.VerdictStmt{Verdict: nft.Jump("svc-web")}) }, unix.EMLINK, "loop"},
		{"delete table, then fail", func(tx *nft.Tx) { tx.DelTable(); tx.AddChain(nft.Chain{Name: "x"}); tx.DelChain("nope") }, unix.ENOENT, "op 2"},
		{"many changes, then fail", func(tx *nft.Tx) {
			tx.FlushChain("svc-web")
			tx.FlushChain("services")
			tx.DelElem(mpNodePorts, nft.MapKey{Protocol: "TCP", Port: 30080})
			tx.DelMap(mpSvc6)
			tx.DelElem(mpSvc4, nft.MapKey{Addr: mpClusterIP, Protocol: "TCP", Port: 80})
			tx.DelChain("svc-web")
			tx.FlushChain("ep-web-6")
			tx.DelSet(nft.AddrSet{Name: "affinity-web-ep6"})
			tx.AddChain(nft.Chain{Name: "new"})
			tx.AddRule("new", nft.VerdictStmt{Verdict: nft.Jump("ep-web-1")})
			tx.AddElem(mpNodePorts, nft.MapKey{Protocol: "TCP", Port: 1}, nft.Goto("new"))
			tx.AddRule("services", nft.VerdictStmt{Verdict: nft.Jump("new")})
			tx.AddRule(mpNatPost.Name, nft.VerdictStmt{Verdict: nft.Jump("new")}) // dnat in postrouting: fails at commit
		}, unix.EOPNOTSUPP, "dnat"},
		{"too deep", func(tx *nft.Tx) {
			for i := range 18 {
				tx.AddChain(nft.Chain{Name: "deep" + string(rune('a'+i))})
			}
			for i := range 17 {
				tx.AddRule("deep"+string(rune('a'+i)), nft.VerdictStmt{Verdict: nft.Jump("deep" + string(rune('a'+i+1)))})
			}
			tx.AddRule(mpFiltIn.Name, nft.VerdictStmt{Verdict: nft.Jump("deepa")})
		}, unix.EMLINK, "nested"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFake()
			if err := f.Apply(miniProxy()); err != nil {
				t.Fatal(err)
			}
			before, ops := f.Dump(), f.Ops()
			tx := &nft.Tx{}
			tc.tx(tx)
			err := f.Apply(tx)
			if !errors.Is(err, tc.errno) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Apply = %v, want %v (%s) containing %q", err, tc.errno, tc.errno.Error(), tc.want)
			}
			if f.Dump() != before || f.Ops() != ops {
				t.Errorf("failed Apply changed the fake")
			}
			if err := f.table.checkRefs(); err != nil {
				t.Errorf("after the failed Apply: %v", err)
			}
		})
	}
}

// TestFakeChanges: elements and chains come and go in later Txs; re-adding
// what exists (same verdict, same base chain) is a no-op, as in the kernel.
func TestFakeChanges(t *testing.T) {
	f := NewFake()
	if err := f.Apply(miniProxy()); err != nil {
		t.Fatal(err)
	}
	tx := &nft.Tx{}
	tx.AddChain(mpNatPre)
	tx.AddChain(nft.Chain{Name: "svc-web"}) // exists: no-op
	tx.AddMap(mpSvc4)
	tx.AddSet(nft.AddrSet{Name: "affinity-web-ep1", Timeout: 3 * time.Hour})
	tx.AddElem(mpSvc4, nft.MapKey{Addr: mpClusterIP, Protocol: "tcp", Port: 80}, nft.Goto("svc-web")) // same verdict
	if err := f.Apply(tx); err != nil {
		t.Fatal(err)
	}
	before := f.Dump()

	tx = &nft.Tx{}
	tx.DelElem(mpSvc6, nft.MapKey{Addr: mpClusterIP6, Protocol: "TCP", Port: 80})
	tx.DelElem(mpSvc4, nft.MapKey{Addr: mpClusterIP, Protocol: "TCP", Port: 80})
	tx.DelElem(mpNodePorts, nft.MapKey{Protocol: "TCP", Port: 30080})
	tx.FlushChain("svc-web")
	tx.DelChain("svc-web")
	tx.FlushChain("ep-web-6")
	tx.DelChain("ep-web-6")
	tx.FlushChain("ep-web-2")
	tx.DelChain("ep-web-2")
	tx.AddElem(mpSvc4, nft.MapKey{Addr: mpClusterIP, Protocol: "TCP", Port: 80}, nft.Verdict{Kind: nft.VerdictDrop})
	if err := f.Apply(tx); err != nil {
		t.Fatal(err)
	}
	got := f.Dump()
	for _, gone := range []string{"chain svc-web", "chain ep-web-2", "chain ep-web-6", "30080", "goto svc-web"} {
		if strings.Contains(got, gone) {
			t.Errorf("%q still in the table:\n%s", gone, got)
		}
	}
	if !strings.Contains(got, "elements = { 10.96.0.10 . tcp . 80 : drop }") {
		t.Errorf("replaced element missing:\n%s", got)
	}
	if got == before {
		t.Error("Dump unchanged")
	}
	if err := f.table.checkRefs(); err != nil {
		t.Error(err)
	}
}

func TestNFTDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		3 * time.Hour:                   "3h",
		90 * time.Minute:                "1h30m",
		10 * time.Second:                "10s",
		250 * time.Millisecond:          "250ms",
		26*time.Hour + 1*time.Second:    "1d2h1s",
		10800*time.Second + time.Second: "3h1s",
	} {
		if got := nftDuration(d); got != want {
			t.Errorf("nftDuration(%s) = %q, want %q", d, got, want)
		}
	}
}

// checkRefs recounts who refers to what and compares with the counts Apply
// keeps.
func (t *fakeTable) checkRefs() error {
	want := newFakeTable()
	x := &fakeTx{t: want}
	for name, c := range t.chains {
		for _, r := range c.rules {
			x.refRule(name, r, 1)
		}
	}
	for name, m := range t.maps {
		for _, v := range m.elems {
			if v.Chain != "" {
				x.bump2(want.elemRefs, v.Chain, name, 1)
			}
		}
	}
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"ruleRefs", t.ruleRefs, want.ruleRefs},
		{"elemRefs", t.elemRefs, want.elemRefs},
		{"mapUsers", t.mapUsers, want.mapUsers},
		{"setRefs", t.setRefs, want.setRefs},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			return fmt.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	return nil
}

// BenchmarkFakeSmallApply: a one-service change to a table of 10,000
// services costs what it changes, not the table's size (the undo log and
// the commit check from the changed chains only).
func BenchmarkFakeSmallApply(b *testing.B) {
	f := NewFake()
	tx := &nft.Tx{}
	tx.AddChain(mpNatPre)
	tx.AddChain(mpNatOut)
	tx.AddMap(mpSvc4)
	tx.AddChain(nft.Chain{Name: "services"})
	tx.AddRule("services", nft.MapLookup{Map: mpSvc4.Name, Key: mpSvc4.Key})
	tx.AddRule(mpNatPre.Name, nft.VerdictStmt{Verdict: nft.Jump("services")})
	tx.AddRule(mpNatOut.Name, nft.VerdictStmt{Verdict: nft.Jump("services")})
	for i := range 10000 {
		svc, ep := fmt.Sprintf("svc-%05d", i), fmt.Sprintf("ep-%05d", i)
		tx.AddChain(nft.Chain{Name: svc})
		tx.AddChain(nft.Chain{Name: ep})
		tx.AddRule(ep, nft.MatchProtoPort{Protocol: "TCP"}, nft.DNAT{Addr: netip.AddrFrom4([4]byte{10, 42, byte(i >> 8), byte(i)}), Port: 8080})
		tx.AddRule(svc, nft.VerdictStmt{Verdict: nft.Goto(ep)})
		tx.AddElem(mpSvc4, nft.MapKey{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Protocol: "TCP", Port: 80}, nft.Goto(svc))
	}
	if err := f.Apply(tx); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		ep := fmt.Sprintf("ep-%05d", i%10000)
		tx := &nft.Tx{}
		tx.FlushChain(ep)
		tx.AddRule(ep, nft.MatchProtoPort{Protocol: "TCP"}, nft.DNAT{Addr: mpEP1, Port: uint16(1 + i%1000)})
		if err := f.Apply(tx); err != nil {
			b.Fatal(err)
		}
	}
}
