package nfttest

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/outpost-edge/outpost/netproxy/nft"
)

func TestNormalizeNFT(t *testing.T) {
	in := `table inet outpost {
	map m {
		type inet_proto . inet_service : verdict
		elements = { udp . 53 : drop, tcp . 80 : accept,
			     sctp . 1 : drop }
	}

	chain b {
		type filter hook input priority filter - 10; policy accept;
	}

	chain a {
		type nat hook prerouting priority dstnat; policy accept;
		tcp dport 80 accept
	}

	set s {
		type ipv4_addr
	}
}
`
	want := `table inet outpost {
	map m {
		type inet_proto . inet_service : verdict
		elements = { sctp . 1 : drop,
			     tcp . 80 : accept,
			     udp . 53 : drop }
	}

	set s {
		type ipv4_addr
	}

	chain a {
		type nat hook prerouting priority -100; policy accept;
		tcp dport 80 accept
	}

	chain b {
		type filter hook input priority -10; policy accept;
	}
}
`
	if got := Normalize(in); got != want {
		t.Errorf("Normalize =\n%s\nwant\n%s", got, want)
	}
}

// errnoOf returns the errno inside err, 0 if none.
func errnoOf(err error) unix.Errno {
	var e unix.Errno
	if errors.As(err, &e) {
		return e
	}
	return 0
}

type equivStep struct {
	name string
	tx   func(tx *nft.Tx)
	// errno is what the kernel and the fake refuse the nft.Tx with; 0 when
	// the nft.Tx succeeds.
	errno unix.Errno
}

// equivSteps are applied in order to the kernel and to the fake.
var equivSteps = []equivStep{
	{name: "mini proxy", tx: func(tx *nft.Tx) { tx.Ops = miniProxy().Ops }},
	{name: "every other statement form", tx: func(tx *nft.Tx) {
		tx.AddChain(nft.Chain{Name: "svc-three"})
		tx.AddRule("svc-three", nft.MatchRandom{Mod: 3}, nft.VerdictStmt{Verdict: nft.Goto("ep-web-1")})
		tx.AddRule("svc-three", nft.MatchRandom{Mod: 2}, nft.VerdictStmt{Verdict: nft.Goto("ep-web-2")})
		tx.AddRule("svc-three", nft.VerdictStmt{Verdict: nft.Goto("ep-web-6")})
		tx.AddElem(mpSvc4, nft.MapKey{Addr: netip.MustParseAddr("10.96.0.11"), Protocol: "TCP", Port: 443}, nft.Goto("svc-three"))
		tx.AddElem(mpSvc4, nft.MapKey{Addr: netip.MustParseAddr("10.96.0.12"), Protocol: "SCTP", Port: 3868}, nft.Jump("svc-three"))
		tx.AddElem(mpSvc6, nft.MapKey{Addr: netip.MustParseAddr("fd00:96::11"), Protocol: "UDP", Port: 53}, nft.Verdict{Kind: nft.VerdictReturn})
		tx.AddElem(mpNodePorts, nft.MapKey{Protocol: "SCTP", Port: 30000}, nft.Jump("svc-three"))
		tx.AddElem(mpNodePorts, nft.MapKey{Protocol: "UDP", Port: 30001}, nft.Verdict{Kind: nft.VerdictAccept})
		tx.AddRule(mpNatPost.Name, nft.MatchMark{Bit: mpMarkMasq, Set: true}, nft.Masquerade{})
		tx.AddRule(mpNatPost.Name, nft.MatchAddr{Prefix: netip.MustParsePrefix("fd00:42::/64")}, nft.MatchAddr{Dst: true, Not: true, Prefix: netip.MustParsePrefix("fd00:42::/64")}, nft.Masquerade{})
		tx.AddRule(mpFiltIn.Name, nft.MatchFamily{}, nft.MatchAddrType{Dst: true}, nft.MatchAddr{Dst: true, Prefix: netip.MustParsePrefix("192.168.1.10/32")}, nft.MatchProtoPort{Protocol: "SCTP", Port: 9}, nft.VerdictStmt{Verdict: nft.Verdict{Kind: nft.VerdictAccept}})
		tx.AddRule(mpFiltIn.Name, nft.MatchFamily{V6: true}, nft.MatchAddrType{Not: true}, nft.VerdictStmt{Verdict: nft.Verdict{Kind: nft.VerdictDrop}})
		tx.AddRule(mpFiltIn.Name, nft.MatchAddr{Dst: true, Not: true, Prefix: netip.MustParsePrefix("::1/128")}, nft.MatchProtoPort{Protocol: "UDP"}, nft.Reject{})
		tx.AddRule(mpFiltOut.Name, nft.MatchFamily{V6: true}, nft.MatchProtoPort{Protocol: "TCP", Port: 80}, nft.VerdictStmt{Verdict: nft.Verdict{Kind: nft.VerdictAccept}})
		tx.AddRule(mpFiltOut.Name, nft.MatchFamily{}, nft.SetLookup{Set: "affinity-web-ep1"}, nft.VerdictStmt{Verdict: nft.Verdict{Kind: nft.VerdictAccept}})
		tx.AddRule(mpFiltOut.Name, nft.MatchAddr{Prefix: netip.MustParsePrefix("10.0.0.0/8")}, nft.MatchAddr{Dst: true, Prefix: netip.MustParsePrefix("fd00::/8")}, nft.VerdictStmt{Verdict: nft.Verdict{Kind: nft.VerdictDrop}})
		tx.AddRule("services", nft.MatchFamily{V6: true}, nft.MapLookup{Map: mpNodePorts.Name, Key: nft.KeyProtoPort})
		tx.AddRule("services", nft.MatchFamily{}, nft.MatchAddrType{Dst: true}, nft.MapLookup{Map: mpSvc4.Name, Key: nft.KeyAddr4ProtoPort})
		tx.Ops = append(tx.Ops, nft.Op{Kind: nft.OpAddRule, Chain: nft.Chain{Name: mpFiltOut.Name}, Rule: nft.Rule{
			Stmts:   []nft.Stmt{nft.MatchMark{Bit: 0x1}, nft.SetMark{Bit: 0x2}, nft.VerdictStmt{Verdict: nft.Verdict{Kind: nft.VerdictReturn}}},
			Comment: "ns/svc:port",
		}})
	}},
	{name: "shared DNAT rules through endpoint maps", tx: func(tx *nft.Tx) {
		ep4 := nft.Map{Name: "endpoints-k2", Key: nft.KeyAddr4ProtoPortIndex}
		ep6 := nft.Map{Name: "endpoints6-k1", Key: nft.KeyAddr6ProtoPortIndex}
		ips := nft.Map{Name: "cluster-ips", Key: nft.KeyAddr4ProtoPort, Set: true}
		ips6 := nft.Map{Name: "cluster-ips6", Key: nft.KeyAddr6ProtoPort, Set: true}
		for _, m := range []nft.Map{ep4, ep6, ips, ips6} {
			tx.AddMap(m)
		}
		vip := netip.MustParseAddr("10.96.0.20")
		vip6 := netip.MustParseAddr("fd00:96::20")
		tx.AddElem(ips, nft.MapKey{Addr: vip, Protocol: "TCP", Port: 80}, nft.Verdict{})
		tx.AddElem(ips6, nft.MapKey{Addr: vip6, Protocol: "UDP", Port: 53}, nft.Verdict{})
		tx.AddEndpointElem(ep4, nft.MapKey{Addr: vip, Protocol: "TCP", Port: 80}, netip.AddrPortFrom(mpEP1, 8080))
		tx.AddEndpointElem(ep4, nft.MapKey{Addr: vip, Protocol: "TCP", Port: 80, Index: 1}, netip.AddrPortFrom(mpEP2, 8081))
		tx.AddEndpointElem(ep6, nft.MapKey{Addr: vip6, Protocol: "UDP", Port: 53}, netip.MustParseAddrPort("[fd00:42::7]:5353"))
		tx.AddRule("services", nft.MatchSet{Set: ips.Name, Key: ips.Key}, nft.MatchAddr{Not: true, Prefix: netip.MustParsePrefix("10.42.0.0/16")}, nft.VerdictStmt{Verdict: nft.Jump("svc-three")})
		tx.AddRule("services", nft.MatchSet{Set: ips6.Name, Key: ips6.Key}, nft.VerdictStmt{Verdict: nft.Jump("svc-three")})
		tx.AddRule("services", nft.DNATMap{Map: ep4.Name, Mod: 2})
		tx.AddRule("services", nft.DNATMap{Map: ep6.Name, V6: true, Mod: 1})
	}},
	{name: "endpoint elements replaced and deleted", tx: func(tx *nft.Tx) {
		ep4 := nft.Map{Name: "endpoints-k2", Key: nft.KeyAddr4ProtoPortIndex}
		vip := netip.MustParseAddr("10.96.0.20")
		tx.DelElem(ep4, nft.MapKey{Addr: vip, Protocol: "TCP", Port: 80, Index: 1})
		tx.AddEndpointElem(ep4, nft.MapKey{Addr: vip, Protocol: "TCP", Port: 80, Index: 1}, netip.AddrPortFrom(mpEP1, 9090))
		tx.DelElem(nft.Map{Name: "cluster-ips6", Key: nft.KeyAddr6ProtoPort, Set: true}, nft.MapKey{Addr: netip.MustParseAddr("fd00:96::20"), Protocol: "UDP", Port: 53})
		tx.DelElem(nft.Map{Name: "endpoints6-k1", Key: nft.KeyAddr6ProtoPortIndex}, nft.MapKey{Addr: netip.MustParseAddr("fd00:96::20"), Protocol: "UDP", Port: 53})
	}},
	{name: "endpoint element with another endpoint", errno: unix.EEXIST, tx: func(tx *nft.Tx) {
		tx.AddEndpointElem(nft.Map{Name: "endpoints-k2", Key: nft.KeyAddr4ProtoPortIndex}, nft.MapKey{Addr: netip.MustParseAddr("10.96.0.20"), Protocol: "TCP", Port: 80}, netip.AddrPortFrom(mpEP2, 1))
	}},
	{name: "dnat through a missing map", errno: unix.ENOENT, tx: func(tx *nft.Tx) {
		tx.AddRule("services", nft.DNATMap{Map: "missing", Mod: 2})
	}},
	{name: "dnat through a map reachable from postrouting", errno: unix.EOPNOTSUPP, tx: func(tx *nft.Tx) {
		tx.AddRule(mpNatPost.Name, nft.DNATMap{Map: "endpoints-k2", Mod: 2})
	}},
	{name: "elements replaced, re-added and deleted; chains flushed and deleted", tx: func(tx *nft.Tx) {
		tx.AddElem(mpNodePorts, nft.MapKey{Protocol: "TCP", Port: 30080}, nft.Goto("svc-web")) // same verdict: no-op
		tx.DelElem(mpNodePorts, nft.MapKey{Protocol: "UDP", Port: 30053})
		tx.AddElem(mpNodePorts, nft.MapKey{Protocol: "UDP", Port: 30053}, nft.Goto("svc-three"))
		tx.DelElem(mpSvc6, nft.MapKey{Addr: netip.MustParseAddr("fd00:96::11"), Protocol: "UDP", Port: 53})
		tx.DelElem(mpSvc4, nft.MapKey{Addr: netip.MustParseAddr("10.96.0.12"), Protocol: "SCTP", Port: 3868})
		tx.FlushChain("ep-web-2")
		tx.AddRule("ep-web-2", nft.MatchProtoPort{Protocol: "TCP"}, nft.DNAT{Addr: mpEP2, Port: 9090})
		tx.FlushChain("svc-three")
		tx.AddRule("svc-three", nft.VerdictStmt{Verdict: nft.Goto("ep-web-2")})
		tx.DelElem(mpSvc6, nft.MapKey{Addr: mpClusterIP6, Protocol: "TCP", Port: 80})
		tx.FlushChain("svc-web")
		tx.AddRule("svc-web", nft.MatchFamily{}, nft.MatchRandom{Mod: 2}, nft.VerdictStmt{Verdict: nft.Goto("ep-web-1")})
		tx.AddRule("svc-web", nft.MatchFamily{}, nft.VerdictStmt{Verdict: nft.Goto("ep-web-2")})
		tx.FlushChain("ep-web-6")
		tx.DelChain("ep-web-6")
	}},
	{name: "affinity set re-created with another timeout", tx: func(tx *nft.Tx) {
		tx.FlushChain("ep-web-1")
		tx.FlushChain(mpFiltOut.Name)
		tx.DelSet(nft.AddrSet{Name: "affinity-web-ep1"})
		tx.AddSet(nft.AddrSet{Name: "affinity-web-ep1", Timeout: 10800 * time.Second})
		tx.DelSet(nft.AddrSet{Name: "affinity-web-ep6"})
		tx.AddRule("ep-web-1", nft.SetUpdate{Set: "affinity-web-ep1"})
		tx.AddRule("ep-web-1", nft.DNAT{Addr: mpEP1, Port: 8080})
	}},
	{name: "jump to a missing chain", errno: unix.ENOENT, tx: func(tx *nft.Tx) {
		tx.AddChain(nft.Chain{Name: "new"})
		tx.AddRule("new", nft.VerdictStmt{Verdict: nft.Jump("missing")})
	}},
	{name: "rule in a missing chain", errno: unix.ENOENT, tx: func(tx *nft.Tx) {
		tx.AddElem(mpNodePorts, nft.MapKey{Protocol: "TCP", Port: 1}, nft.Verdict{Kind: nft.VerdictDrop})
		tx.AddRule("missing", nft.VerdictStmt{Verdict: nft.Verdict{Kind: nft.VerdictAccept}})
	}},
	{name: "numgen modulus 0", errno: unix.ERANGE, tx: func(tx *nft.Tx) {
		tx.AddRule("svc-three", nft.MatchRandom{}, nft.VerdictStmt{Verdict: nft.Goto("ep-web-1")})
	}},
	{name: "lookup in a missing map", errno: unix.ENOENT, tx: func(tx *nft.Tx) {
		tx.AddRule("services", nft.MapLookup{Map: "missing", Key: nft.KeyProtoPort})
	}},
	{name: "lookup in a missing set", errno: unix.ENOENT, tx: func(tx *nft.Tx) {
		tx.AddRule("svc-web", nft.SetLookup{Set: "missing"}, nft.VerdictStmt{Verdict: nft.Goto("ep-web-1")})
	}},
	{name: "element with another verdict", errno: unix.EEXIST, tx: func(tx *nft.Tx) {
		tx.AddElem(mpNodePorts, nft.MapKey{Protocol: "TCP", Port: 30080}, nft.Goto("svc-three"))
	}},
	{name: "element in a missing map", errno: unix.ENOENT, tx: func(tx *nft.Tx) {
		tx.AddElem(nft.Map{Name: "missing", Key: nft.KeyProtoPort}, nft.MapKey{Protocol: "TCP", Port: 1}, nft.Verdict{Kind: nft.VerdictDrop})
	}},
	{name: "element to a missing chain", errno: unix.ENOENT, tx: func(tx *nft.Tx) {
		tx.AddElem(mpNodePorts, nft.MapKey{Protocol: "TCP", Port: 2}, nft.Goto("missing"))
	}},
	{name: "delete a missing element", errno: unix.ENOENT, tx: func(tx *nft.Tx) {
		tx.DelElem(mpNodePorts, nft.MapKey{Protocol: "TCP", Port: 3})
	}},
	{name: "delete a chain still jumped to", errno: unix.EBUSY, tx: func(tx *nft.Tx) {
		tx.FlushChain("svc-three")
		tx.DelChain("svc-three")
	}},
	{name: "delete a map in use", errno: unix.EBUSY, tx: func(tx *nft.Tx) { tx.DelMap(mpSvc4) }},
	{name: "delete a set in use", errno: unix.EBUSY, tx: func(tx *nft.Tx) { tx.DelSet(nft.AddrSet{Name: "affinity-web-ep1"}) }},
	{name: "delete a missing chain", errno: unix.ENOENT, tx: func(tx *nft.Tx) { tx.DelChain("missing") }},
	{name: "delete a missing map", errno: unix.ENOENT, tx: func(tx *nft.Tx) { tx.DelMap(nft.Map{Name: "missing", Key: nft.KeyProtoPort}) }},
	{name: "delete a missing set", errno: unix.ENOENT, tx: func(tx *nft.Tx) { tx.DelSet(nft.AddrSet{Name: "missing"}) }},
	{name: "flush a missing chain", errno: unix.ENOENT, tx: func(tx *nft.Tx) { tx.FlushChain("missing") }},
	{name: "base chain re-added with another priority", errno: unix.EOPNOTSUPP, tx: func(tx *nft.Tx) {
		tx.AddChain(nft.Chain{Name: mpNatPre.Name, Base: &nft.Base{Type: nft.ChainTypeNAT, Hook: nft.HookPrerouting, Priority: -99}})
	}},
	{name: "masquerade reachable from prerouting", errno: unix.EOPNOTSUPP, tx: func(tx *nft.Tx) {
		tx.AddRule("ep-web-2", nft.Masquerade{})
	}},
	{name: "dnat reachable from postrouting", errno: unix.EOPNOTSUPP, tx: func(tx *nft.Tx) {
		tx.AddRule(mpNatPost.Name, nft.VerdictStmt{Verdict: nft.Jump("ep-web-1")})
	}},
	// Kernels since 5.x find the loop as too deep a jump stack (EMLINK);
	// older ones said ELOOP.
	{name: "a loop", errno: unix.EMLINK, tx: func(tx *nft.Tx) {
		tx.AddRule("ep-web-2", nft.VerdictStmt{Verdict: nft.Jump("svc-web")})
	}},
	// The kernel validates only what a base chain reaches.
	{name: "a loop no base chain reaches is accepted", tx: func(tx *nft.Tx) {
		tx.AddChain(nft.Chain{Name: "loop-a"})
		tx.AddChain(nft.Chain{Name: "loop-b"})
		tx.AddRule("loop-a", nft.VerdictStmt{Verdict: nft.Jump("loop-b")})
		tx.AddRule("loop-b", nft.VerdictStmt{Verdict: nft.Goto("loop-a")})
	}},
	{name: "regular chain re-added as a base chain", errno: unix.EEXIST, tx: func(tx *nft.Tx) {
		tx.AddChain(nft.Chain{Name: "svc-web", Base: mpNatOut.Base})
	}},
	{name: "map re-added with another key type", errno: unix.EEXIST, tx: func(tx *nft.Tx) {
		tx.AddMap(nft.Map{Name: mpNodePorts.Name, Key: nft.KeyAddr4ProtoPort})
	}},
	{name: "delete table and rebuild in one tx", tx: func(tx *nft.Tx) {
		tx.DelTable()
		tx.AddMap(mpNodePorts)
		tx.AddChain(mpNatPre)
		tx.AddChain(nft.Chain{Name: "svc-np"})
		tx.AddRule("svc-np", nft.DNAT{Addr: mpEP1, Port: 80})
		tx.AddElem(mpNodePorts, nft.MapKey{Protocol: "TCP", Port: 30080}, nft.Goto("svc-np"))
		tx.AddRule(mpNatPre.Name, nft.MatchAddrType{Dst: true}, nft.MapLookup{Map: mpNodePorts.Name, Key: nft.KeyProtoPort})
	}},
	{name: "delete table", tx: func(tx *nft.Tx) { tx.DelTable() }},
	{name: "delete the missing table", tx: func(tx *nft.Tx) { tx.DelTable() }},
}

// TestE2ENetlinkMatchesFake applies the same Txs to the kernel (in a
// fresh netns) and to the Fake: both accept or both refuse each one (with
// the same errno), a refused nft.Tx leaves the kernel's table as it was, and
// after each the kernel's table (as nft lists it, normalized by
// Normalize) is the Fake's Dump, and List agrees.
func TestE2ENetlinkMatchesFake(t *testing.T) {
	ns := NetNS(t)
	nl := nft.NewNetlink(ns)
	f := NewFake()
	before := ListTable(t, ns)
	for _, step := range equivSteps {
		tx := &nft.Tx{}
		step.tx(tx)
		errK, errF := nl.Apply(tx), f.Apply(tx)
		if step.errno != 0 {
			if errnoOf(errK) != step.errno {
				t.Errorf("%s: kernel: %v, want %v (%s)", step.name, errK, step.errno, step.errno.Error())
			}
			if errnoOf(errF) != step.errno {
				t.Errorf("%s: fake: %v, want %v (%s)", step.name, errF, step.errno, step.errno.Error())
			}
		} else if errK != nil || errF != nil {
			t.Fatalf("%s: kernel: %v; fake: %v", step.name, errK, errF)
		}
		after := ListTable(t, ns)
		if step.errno != 0 && after != before {
			t.Errorf("%s: the failed Tx changed the kernel's table:\n%s", step.name, after)
		}
		before = after
		if f.table != nil {
			if err := f.table.checkRefs(); err != nil {
				t.Errorf("%s: fake: %v", step.name, err)
			}
		}
		got, want := Normalize(after), f.Dump()
		if got != want {
			t.Fatalf("%s: kernel and fake differ (nft %s)\nkernel (normalized):\n%s\nfake:\n%s\ndiff:\n%s", step.name, NFTVersion(), got, want, LineDiff(got, want))
		}
		lk, err := nl.List()
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		lf, _ := f.List()
		if fmt.Sprint(lk) != fmt.Sprint(lf) {
			t.Errorf("%s: List: kernel %+v, fake %+v", step.name, lk, lf)
		}
	}
}
