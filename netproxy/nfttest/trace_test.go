package nfttest

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/outpost-edge/outpost/netproxy/nft"
)

var (
	mpNodeIP = netip.MustParseAddr("192.168.1.10")
	mpClient = netip.MustParseAddr("192.0.2.1")
	mpPod    = netip.MustParseAddr("10.42.0.9")
)

func mpLocal(a netip.Addr) bool { return a == mpNodeIP || a == netip.MustParseAddr("127.0.0.1") }

func outcomeStrings(outs []Outcome) []string {
	s := make([]string, len(outs))
	for i, o := range outs {
		s[i] = o.String()
	}
	return s
}

// TestTraceMiniProxy pushes packets through the hand-built ruleset of
// fake_test.go and checks where they go, not how the rules read.
func TestTraceMiniProxy(t *testing.T) {
	f := NewFake()
	if err := f.Apply(miniProxy()); err != nil {
		t.Fatal(err)
	}
	both := []string{
		"dnat to 10.42.0.5:8080, update @affinity-web-ep1",
		"dnat to 10.42.1.7:8080",
	}
	bothMasq := []string{
		"dnat to 10.42.0.5:8080, masquerade, update @affinity-web-ep1",
		"dnat to 10.42.1.7:8080, masquerade",
	}
	for _, tc := range []struct {
		name string
		p    Packet
		want []string
	}{
		{"pod to ClusterIP balances over both endpoints", Packet{Src: mpPod, Dst: mpClusterIP, Protocol: "TCP", Port: 80}, both},
		{"protocol is case-insensitive", Packet{Src: mpPod, Dst: mpClusterIP, Protocol: "tcp", Port: 80}, both},
		{"outside client to ClusterIP is masqueraded", Packet{Src: mpClient, Dst: mpClusterIP, Protocol: "TCP", Port: 80}, bothMasq},
		{"endpoint reaching itself is masqueraded (hairpin)", Packet{Src: mpEP1, Dst: mpClusterIP, Protocol: "TCP", Port: 80}, []string{
			"dnat to 10.42.0.5:8080, masquerade, update @affinity-web-ep1",
			"dnat to 10.42.1.7:8080",
		}},
		{"node to ClusterIP (output)", Packet{Src: mpNodeIP, Dst: mpClusterIP, Protocol: "TCP", Port: 80, Output: true}, bothMasq},
		{"NodePort from outside", Packet{Src: mpClient, Dst: mpNodeIP, Protocol: "TCP", Port: 30080}, bothMasq},
		{"NodePort on a non-local address is not a NodePort", Packet{Src: mpClient, Dst: netip.MustParseAddr("192.168.1.99"), Protocol: "TCP", Port: 30080}, []string{"accept"}},
		{"NodePort from the node itself", Packet{Src: mpNodeIP, Dst: mpNodeIP, Protocol: "TCP", Port: 30080, Output: true}, bothMasq},
		{"NodePort map drop", Packet{Src: mpClient, Dst: mpNodeIP, Protocol: "UDP", Port: 30053}, []string{"drop"}},
		{"ClusterIP without endpoints rejects (forward)", Packet{Src: mpPod, Dst: mpClusterIP, Protocol: "UDP", Port: 53}, []string{"reject"}},
		{"ClusterIP without endpoints rejects (output)", Packet{Src: mpNodeIP, Dst: mpClusterIP, Protocol: "UDP", Port: 53, Output: true}, []string{"reject"}},
		{"other port of the ClusterIP", Packet{Src: mpPod, Dst: mpClusterIP, Protocol: "TCP", Port: 81}, []string{"accept"}},
		{"IPv6 ClusterIP", Packet{Src: netip.MustParseAddr("fd00:42::9"), Dst: mpClusterIP6, Protocol: "TCP", Port: 80}, []string{"dnat to [fd00:42::5]:8080, update @affinity-web-ep6"}},
		{"IPv6 from outside the (v4) pod CIDR is not marked", Packet{Src: netip.MustParseAddr("2001:db8::1"), Dst: mpClusterIP6, Protocol: "TCP", Port: 80}, []string{"dnat to [fd00:42::5]:8080, update @affinity-web-ep6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outs, err := f.Trace(tc.p, mpLocal)
			if err != nil {
				t.Fatal(err)
			}
			if got := outcomeStrings(outs); !slices.Equal(got, tc.want) {
				t.Errorf("Trace(%+v) =\n%s\nwant\n%s", tc.p, strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

func TestTraceChains(t *testing.T) {
	f := NewFake()
	if err := f.Apply(miniProxy()); err != nil {
		t.Fatal(err)
	}
	outs, err := f.Trace(Packet{Src: mpClient, Dst: mpClusterIP, Protocol: "TCP", Port: 80}, mpLocal)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"nat-prerouting", "services", "svc-web", "mark-for-masquerade", "ep-web-1", "filter-forward", "reject-services", "nat-postrouting"},
		{"nat-prerouting", "services", "svc-web", "mark-for-masquerade", "ep-web-2", "filter-forward", "reject-services", "nat-postrouting"},
	}
	if len(outs) != len(want) {
		t.Fatalf("got %d outcomes, want %d", len(outs), len(want))
	}
	for i := range want {
		if !slices.Equal(outs[i].Chains, want[i]) {
			t.Errorf("outcome %d chains = %v, want %v", i, outs[i].Chains, want[i])
		}
	}

	// Local delivery: an arriving packet for the node goes to input and
	// not through forward or postrouting.
	outs, err = f.Trace(Packet{Src: mpClient, Dst: mpNodeIP, Protocol: "TCP", Port: 22}, mpLocal)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"nat-prerouting", "services", "filter-input", "reject-services"}; len(outs) != 1 || !slices.Equal(outs[0].Chains, want) {
		t.Errorf("local delivery = %+v, want chains %v", outs, want)
	}
	// The node talking to itself: output, postrouting, then input.
	outs, err = f.Trace(Packet{Src: mpNodeIP, Dst: mpNodeIP, Protocol: "TCP", Port: 22, Output: true}, mpLocal)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"nat-output", "services", "filter-output", "reject-services", "nat-postrouting", "filter-input", "reject-services"}; len(outs) != 1 || !slices.Equal(outs[0].Chains, want) {
		t.Errorf("node to itself = %+v, want chains %v", outs, want)
	}
}

func TestTraceAffinity(t *testing.T) {
	f := NewFake()
	if err := f.Apply(miniProxy()); err != nil {
		t.Fatal(err)
	}
	if err := f.AddSetElement("affinity-web-ep1", mpPod); err != nil {
		t.Fatal(err)
	}
	outs, err := f.Trace(Packet{Src: mpPod, Dst: mpClusterIP, Protocol: "TCP", Port: 80}, mpLocal)
	if err != nil {
		t.Fatal(err)
	}
	if got := outcomeStrings(outs); !slices.Equal(got, []string{"dnat to 10.42.0.5:8080, update @affinity-web-ep1"}) {
		t.Errorf("client in the affinity set: %v", got)
	}
	// Another client still balances.
	outs, err = f.Trace(Packet{Src: netip.MustParseAddr("10.42.0.10"), Dst: mpClusterIP, Protocol: "TCP", Port: 80}, mpLocal)
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 2 {
		t.Errorf("other client: %v", outcomeStrings(outs))
	}
	for _, bad := range []struct {
		set  string
		addr netip.Addr
	}{{"nope", mpPod}, {"affinity-web-ep1", mpEP6}} {
		if err := f.AddSetElement(bad.set, bad.addr); err == nil {
			t.Errorf("AddSetElement(%s, %s) succeeded", bad.set, bad.addr)
		}
	}
	// Deleting the set forgets its elements.
	tx := &nft.Tx{}
	tx.FlushChain("svc-web")
	tx.FlushChain("ep-web-1")
	tx.DelSet(nft.AddrSet{Name: "affinity-web-ep1"})
	tx.AddSet(nft.AddrSet{Name: "affinity-web-ep1", Timeout: 10800e9})
	tx.AddRule("svc-web", nft.SetLookup{Set: "affinity-web-ep1"}, nft.VerdictStmt{Verdict: nft.Goto("ep-web-1")})
	tx.AddRule("ep-web-1", nft.DNAT{Addr: mpEP1, Port: 8080})
	if err := f.Apply(tx); err != nil {
		t.Fatal(err)
	}
	outs, err = f.Trace(Packet{Src: mpPod, Dst: mpClusterIP, Protocol: "TCP", Port: 80}, mpLocal)
	if err != nil {
		t.Fatal(err)
	}
	if got := outcomeStrings(outs); !slices.Equal(got, []string{"accept"}) {
		t.Errorf("after re-creating the set: %v", got)
	}
}

// TestTraceNATOnce: once a nat chain of a hook has DNATed the packet, the
// hook's later nat chains are skipped (the kernel sets up NAT once), but
// filter chains still run; a DNAT of the other family does nothing.
func TestTraceNATOnce(t *testing.T) {
	f := NewFake()
	tx := &nft.Tx{}
	tx.AddChain(nft.Chain{Name: "a", Base: &nft.Base{Type: nft.ChainTypeNAT, Hook: nft.HookPrerouting, Priority: -100}})
	tx.AddChain(nft.Chain{Name: "b", Base: &nft.Base{Type: nft.ChainTypeNAT, Hook: nft.HookPrerouting, Priority: -90}})
	tx.AddChain(nft.Chain{Name: "c", Base: &nft.Base{Type: nft.ChainTypeFilter, Hook: nft.HookPrerouting, Priority: -95}})
	tx.AddRule("a", nft.MatchProtoPort{Protocol: "TCP", Port: 1}, nft.DNAT{Addr: mpEP6, Port: 6})
	tx.AddRule("a", nft.MatchProtoPort{Protocol: "TCP", Port: 1}, nft.DNAT{Addr: mpEP1, Port: 1})
	tx.AddRule("b", nft.DNAT{Addr: mpEP2, Port: 2})
	tx.AddRule("c", nft.MatchDNATed{}, nft.VerdictStmt{Verdict: nft.Verdict{Kind: nft.VerdictDrop}})
	if err := f.Apply(tx); err != nil {
		t.Fatal(err)
	}
	for port, want := range map[uint16]string{1: "drop", 2: "dnat to 10.42.1.7:2"} {
		outs, err := f.Trace(Packet{Src: mpClient, Dst: mpClusterIP, Protocol: "TCP", Port: port}, mpLocal)
		if err != nil {
			t.Fatal(err)
		}
		if len(outs) != 1 || outs[0].String() != want && !strings.HasSuffix(outs[0].String(), want) {
			t.Errorf("port %d: %v, want %q", port, outcomeStrings(outs), want)
		}
		if port == 1 && !slices.Equal(outs[0].Chains, []string{"a", "c"}) {
			t.Errorf("port 1 chains = %v, want [a c]", outs[0].Chains)
		}
	}
}

func TestTraceErrors(t *testing.T) {
	f := NewFake()
	tx := &nft.Tx{}
	tx.AddChain(mpNatPre)
	if err := f.Apply(tx); err != nil {
		t.Fatal(err)
	}
	for _, p := range []Packet{
		{Src: mpClient, Dst: mpClusterIP6, Protocol: "TCP", Port: 1},
		{Dst: mpClusterIP, Protocol: "TCP", Port: 1},
		{Src: mpClient, Dst: mpClusterIP, Protocol: "ICMP"},
	} {
		if _, err := f.Trace(p, nil); err == nil {
			t.Errorf("Trace(%+v) succeeded", p)
		}
	}
	// Apply refuses unknown statements (only nft's statement types are
	// statements, and a pointer to one is not); put one in behind its
	// back.
	f.table.chains[mpNatPre.Name].rules = []nft.Rule{{Stmts: []nft.Stmt{&nft.MatchDNATed{}}}}
	if _, err := f.Trace(Packet{Src: mpClient, Dst: mpClusterIP, Protocol: "TCP", Port: 1}, nil); err == nil || !strings.Contains(err.Error(), "*nft.MatchDNATed") {
		t.Errorf("Trace over an unknown statement = %v", err)
	}
	// A loop (which Apply refuses too).
	f.table.chains[mpNatPre.Name].rules = []nft.Rule{{Stmts: []nft.Stmt{nft.VerdictStmt{Verdict: nft.Goto(mpNatPre.Name)}}}}
	if _, err := f.Trace(Packet{Src: mpClient, Dst: mpClusterIP, Protocol: "TCP", Port: 1}, nil); err == nil || !strings.Contains(err.Error(), "loop") {
		t.Errorf("Trace over a loop = %v", err)
	}
}
