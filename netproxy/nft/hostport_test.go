package nft_test

import (
	"flag"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/outpost-edge/outpost/netproxy/nft"
	"github.com/outpost-edge/outpost/netproxy/nfttest"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

func TestNormalize(t *testing.T) {
	podA, podB := ip("10.42.0.2"), ip("10.42.0.3")
	got, err := nft.NormalizeHostPorts([]nft.HostPort{
		{Protocol: "udp", HostPort: 53, PodIP: podB, ContainerPort: 5353},
		{HostPort: 80, PodIP: podA, ContainerPort: 8080},                                                        // protocol defaults to TCP
		{Protocol: "TCP", HostPort: 80, PodIP: podB, ContainerPort: 80},                                         // duplicate of the one above: dropped
		{Protocol: "TCP", HostIP: netip.MustParseAddr("0.0.0.0"), HostPort: 81, PodIP: podA, ContainerPort: 81}, // 0.0.0.0 is any
		{Protocol: "TCP", HostIP: netip.MustParseAddr("::ffff:192.0.2.2"), HostPort: 82, PodIP: podA, ContainerPort: 82},
	})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, hp := range got {
		lines = append(lines, hp.String())
	}
	want := []string{
		"tcp :80->10.42.0.2:8080",
		"tcp :81->10.42.0.2:81",
		"tcp 192.0.2.2:82->10.42.0.2:82",
		"udp :53->10.42.0.3:5353",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("normalize =\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}

	for _, tc := range []struct {
		name string
		hp   nft.HostPort
		want string
	}{
		{"bad protocol", nft.HostPort{Protocol: "ICMP", HostPort: 1, PodIP: podA, ContainerPort: 1}, `protocol "ICMP"`},
		{"no host port", nft.HostPort{PodIP: podA, ContainerPort: 1}, "port must be set"},
		{"no container port", nft.HostPort{HostPort: 1, PodIP: podA}, "port must be set"},
		{"no pod ip", nft.HostPort{HostPort: 1, ContainerPort: 1}, "pod IP is not set"},
		{"mixed families", nft.HostPort{HostIP: netip.MustParseAddr("fd00::1"), HostPort: 1, PodIP: podA, ContainerPort: 1}, "different families"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := nft.NormalizeHostPorts([]nft.HostPort{tc.hp}); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("normalize(%v) = %v, want error containing %q", tc.hp, err, tc.want)
			}
		})
	}
}

// ruleCounts returns the number of rules in each chain of the table.
func ruleCounts(t *testing.T, nsfd int) map[string]int {
	t.Helper()
	c := nft.Conn(t, nsfd)
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, ch := range chains {
		if ch.Table.Name != "outpost" {
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			t.Fatal(err)
		}
		counts[ch.Name] = len(rules)
	}
	return counts
}

// TestE2ETableHostPortsReplace (was TestE2ESyncReplacesAndDelete of the
// old NAT): in a fresh netns holding an outpost table that someone else
// changed (a stray chain with a rule, a nat-prerouting of another
// priority), the first Sync of a Table replaces its contents, 3,000
// hostPorts (over 6,000 rules) apply in one batch, and after a restart
// (a new Table: a full sync) fewer hostPorts leave fewer rules and the
// stray chain is gone; an incremental Sync without hostPorts empties the
// hostports chain. The kernel then holds what a full sync gives on the
// Fake.
func TestE2ETableHostPortsReplace(t *testing.T) {
	ns := nfttest.NetNS(t)
	c := nft.Conn(t, ns)
	c.AddTable(nft.NFTable())
	stray := c.AddChain(&nftables.Chain{Name: "stray", Table: nft.NFTable()})
	c.AddChain(&nftables.Chain{Name: nft.NatPrerouting, Table: nft.NFTable(), Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(-50)})
	c.AddRule(&nftables.Rule{Table: nft.NFTable(), Chain: stray, Exprs: nft.MatchPort("TCP", 1)})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}

	var many []nft.HostPort
	for i := range 3000 {
		many = append(many, nft.HostPort{Protocol: "TCP", HostPort: uint16(10000 + i), PodIP: tsHPPod, ContainerPort: 8080})
	}
	if _, err := nft.NewTable(nft.NewNetlink(ns)).Sync(nft.State{PodCIDR: tsPodCIDR, HostPorts: many}); err != nil {
		t.Fatalf("sync %d hostPorts: %v", len(many), err)
	}
	// nat-postrouting: the two Service hairpin lookups, jump
	// masquerading, a hairpin rule per hostPort, pod egress masquerade.
	got := ruleCounts(t, ns)
	if got[nft.ChainHostPorts] != 3000 || got[nft.NatPostrouting] != 3004 || got["stray"] != 0 {
		t.Errorf("rule counts after large sync: hostports %d, nat-postrouting %d, stray %d; want 3000, 3004, 0",
			got[nft.ChainHostPorts], got[nft.NatPostrouting], got["stray"])
	}

	one := nft.State{PodCIDR: tsPodCIDR, HostPorts: []nft.HostPort{{Protocol: "TCP", HostPort: 30080, PodIP: tsHPPod, ContainerPort: 8080}}}
	tb := nft.NewTable(nft.NewNetlink(ns))
	if _, err := tb.Sync(one); err != nil {
		t.Fatal(err)
	}
	got = ruleCounts(t, ns)
	if _, ok := got["stray"]; ok {
		t.Error("the stray chain survived a full sync")
	}
	if got[nft.ChainHostPorts] != 1 || got[nft.NatPostrouting] != 5 {
		t.Errorf("rule counts after a full sync with one hostPort: hostports %d, nat-postrouting %d; want 1, 5", got[nft.ChainHostPorts], got[nft.NatPostrouting])
	}

	none := nft.State{PodCIDR: tsPodCIDR}
	if _, err := tb.Sync(none); err != nil {
		t.Fatal(err)
	}
	fresh, _ := synced(t, none)
	if got, want := nfttest.Normalize(nfttest.ListTable(t, ns)), fresh.Dump(); got != want {
		t.Errorf("kernel differs from a full sync on the Fake (nft %s):\n%s", nfttest.NFTVersion(), nfttest.LineDiff(want, got))
	}
	if got := ruleCounts(t, ns); got[nft.ChainHostPorts] != 0 || got[nft.NatPostrouting] != 4 {
		t.Errorf("rule counts without hostPorts: hostports %d, nat-postrouting %d; want 0, 4", got[nft.ChainHostPorts], got[nft.NatPostrouting])
	}
}
