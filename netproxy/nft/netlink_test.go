package nft

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nlNetNS returns a fresh network namespace (see newNetNS), skipping the
// test when not root or when this kernel (or emulator) has no nftables
// netlink (any other failure fails it).
func nlNetNS(t *testing.T) int {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and nftables tables")
	}
	if err := Available(); errors.Is(err, unix.EPROTONOSUPPORT) {
		// The one error that means this kernel has no nfnetlink.
		t.Skipf("this kernel has no nftables netlink: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	return newNetNS(t)
}

// nftListTable returns `nft list table inet outpost` run in the netns, or
// "" when there is no table; it fails the test when nft or nsenter is
// missing.
func nftListTable(t *testing.T, nsfd int) string {
	t.Helper()
	for _, tool := range []string{"nft", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not installed: as root the kernel tests need it (`make test` installs it)", tool)
		}
	}
	dup, err := unix.Dup(nsfd)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(dup), "netns")
	defer f.Close()
	cmd := exec.Command("nsenter", "--net=/proc/self/fd/3", "nft", "list", "table", "inet", "outpost")
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "No such file or directory") {
			return ""
		}
		t.Fatalf("nft list table: %v\n%s", err, out)
	}
	return string(out)
}

// Standard priority names nft prints instead of numbers (which ones it
// uses where depends on the nft version).
var priorityNames = map[string]int{"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50, "srcnat": 100}

var priorityRE = regexp.MustCompile(`priority ([a-z]+)(?: ([+-]) (\d+))?;`)

// normalizeNFT makes `nft list table` output comparable with Fake.Dump:
//
//   - a priority name (`dstnat`, `filter - 10`) becomes its number, since
//     nft versions differ in where they print names;
//   - sets and maps, then chains, are sorted by name (nft lists them in
//     the order they were created);
//   - map elements are sorted and printed one a line (nft lists them in
//     the kernel's hash order and wraps lines as it likes).
//
// Everything else (statement wording, the elided `meta nfproto`, `tcp
// dport 80` for `meta l4proto tcp th dport 80`) is Dump's job: it prints
// what nft prints.
func normalizeNFT(s string) string {
	if s == "" {
		return ""
	}
	s = priorityRE.ReplaceAllStringFunc(s, func(m string) string {
		sub := priorityRE.FindStringSubmatch(m)
		p, ok := priorityNames[sub[1]]
		if !ok {
			return m
		}
		if sub[2] != "" {
			n, _ := strconv.Atoi(sub[3])
			if sub[2] == "-" {
				n = -n
			}
			p += n
		}
		return fmt.Sprintf("priority %d;", p)
	})
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "table ") || lines[len(lines)-1] != "}" {
		return s // not a table: compare as is
	}
	type block struct {
		kind, name string
		lines      []string
	}
	var blocks []block
	var cur *block
	for i := 1; i < len(lines)-1; i++ {
		l := lines[i]
		switch {
		case l == "":
		case strings.HasPrefix(l, "\t") && !strings.HasPrefix(l, "\t\t") && l != "\t}":
			f := strings.Fields(l) // "set name {"
			blocks = append(blocks, block{kind: f[0], name: f[1]})
			cur = &blocks[len(blocks)-1]
		case strings.HasPrefix(l, "\t\telements = {"):
			// Gather the elements up to the closing brace.
			text := strings.TrimPrefix(l, "\t\telements = {")
			for !strings.HasSuffix(text, "}") && i+1 < len(lines)-1 {
				i++
				text += " " + strings.TrimSpace(lines[i])
			}
			text = strings.TrimSuffix(text, "}")
			var elems []string
			for _, e := range strings.Split(text, ",") {
				elems = append(elems, strings.TrimSpace(e))
			}
			cur.lines = append(cur.lines, strings.TrimSuffix(formatElements(elems), "\n"))
		case l != "\t}":
			cur.lines = append(cur.lines, l)
		}
	}
	rank := func(kind string) int {
		if kind == "chain" {
			return 1
		}
		return 0 // sets and maps
	}
	slices.SortStableFunc(blocks, func(a, b block) int {
		if d := rank(a.kind) - rank(b.kind); d != 0 {
			return d
		}
		return strings.Compare(a.name, b.name)
	})
	var out []string
	for _, b := range blocks {
		text := fmt.Sprintf("\t%s %s {\n", b.kind, b.name)
		for _, l := range b.lines {
			text += l + "\n"
		}
		out = append(out, text+"\t}\n")
	}
	return lines[0] + "\n" + strings.Join(out, "\n") + "}\n"
}

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
	if got := normalizeNFT(in); got != want {
		t.Errorf("normalizeNFT =\n%s\nwant\n%s", got, want)
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
	tx   func(tx *Tx)
	// errno is what the kernel and the fake refuse the Tx with; 0 when
	// the Tx succeeds.
	errno unix.Errno
}

// equivSteps are applied in order to the kernel and to the fake.
var equivSteps = []equivStep{
	{name: "mini proxy", tx: func(tx *Tx) { tx.Ops = miniProxy().Ops }},
	{name: "every other statement form", tx: func(tx *Tx) {
		tx.AddChain(Chain{Name: "svc-three"})
		tx.AddRule("svc-three", MatchRandom{Mod: 3}, VerdictStmt{Goto("ep-web-1")})
		tx.AddRule("svc-three", MatchRandom{Mod: 2}, VerdictStmt{Goto("ep-web-2")})
		tx.AddRule("svc-three", VerdictStmt{Goto("ep-web-6")})
		tx.AddElem(mpSvc4, MapKey{Addr: netip.MustParseAddr("10.96.0.11"), Protocol: "TCP", Port: 443}, Goto("svc-three"))
		tx.AddElem(mpSvc4, MapKey{Addr: netip.MustParseAddr("10.96.0.12"), Protocol: "SCTP", Port: 3868}, Jump("svc-three"))
		tx.AddElem(mpSvc6, MapKey{Addr: netip.MustParseAddr("fd00:96::11"), Protocol: "UDP", Port: 53}, Verdict{Kind: VerdictReturn})
		tx.AddElem(mpNodePorts, MapKey{Protocol: "SCTP", Port: 30000}, Jump("svc-three"))
		tx.AddElem(mpNodePorts, MapKey{Protocol: "UDP", Port: 30001}, Verdict{Kind: VerdictAccept})
		tx.AddRule(mpNatPost.Name, MatchMark{Bit: mpMarkMasq, Set: true}, Masquerade{})
		tx.AddRule(mpNatPost.Name, MatchAddr{Prefix: netip.MustParsePrefix("fd00:42::/64")}, MatchAddr{Dst: true, Not: true, Prefix: netip.MustParsePrefix("fd00:42::/64")}, Masquerade{})
		tx.AddRule(mpFiltIn.Name, MatchFamily{}, MatchAddrType{Dst: true}, MatchAddr{Dst: true, Prefix: netip.MustParsePrefix("192.168.1.10/32")}, MatchProtoPort{Protocol: "SCTP", Port: 9}, VerdictStmt{Verdict{Kind: VerdictAccept}})
		tx.AddRule(mpFiltIn.Name, MatchFamily{V6: true}, MatchAddrType{Not: true}, VerdictStmt{Verdict{Kind: VerdictDrop}})
		tx.AddRule(mpFiltIn.Name, MatchAddr{Dst: true, Not: true, Prefix: netip.MustParsePrefix("::1/128")}, MatchProtoPort{Protocol: "UDP"}, Reject{})
		tx.AddRule(mpFiltOut.Name, MatchFamily{V6: true}, MatchProtoPort{Protocol: "TCP", Port: 80}, VerdictStmt{Verdict{Kind: VerdictAccept}})
		tx.AddRule(mpFiltOut.Name, MatchFamily{}, SetLookup{Set: "affinity-web-ep1"}, VerdictStmt{Verdict{Kind: VerdictAccept}})
		tx.AddRule(mpFiltOut.Name, MatchAddr{Prefix: netip.MustParsePrefix("10.0.0.0/8")}, MatchAddr{Dst: true, Prefix: netip.MustParsePrefix("fd00::/8")}, VerdictStmt{Verdict{Kind: VerdictDrop}})
		tx.AddRule("services", MatchFamily{V6: true}, MapLookup{Map: mpNodePorts.Name, Key: KeyProtoPort})
		tx.AddRule("services", MatchFamily{}, MatchAddrType{Dst: true}, MapLookup{Map: mpSvc4.Name, Key: KeyAddr4ProtoPort})
		tx.Ops = append(tx.Ops, Op{Kind: OpAddRule, Chain: Chain{Name: mpFiltOut.Name}, Rule: Rule{
			Stmts:   []Stmt{MatchMark{Bit: 0x1}, SetMark{Bit: 0x2}, VerdictStmt{Verdict{Kind: VerdictReturn}}},
			Comment: "ns/svc:port",
		}})
	}},
	{name: "shared DNAT rules through endpoint maps", tx: func(tx *Tx) {
		ep4 := Map{Name: "endpoints-k2", Key: KeyAddr4ProtoPortIndex}
		ep6 := Map{Name: "endpoints6-k1", Key: KeyAddr6ProtoPortIndex}
		ips := Map{Name: "cluster-ips", Key: KeyAddr4ProtoPort, Set: true}
		ips6 := Map{Name: "cluster-ips6", Key: KeyAddr6ProtoPort, Set: true}
		for _, m := range []Map{ep4, ep6, ips, ips6} {
			tx.AddMap(m)
		}
		vip := netip.MustParseAddr("10.96.0.20")
		vip6 := netip.MustParseAddr("fd00:96::20")
		tx.AddElem(ips, MapKey{Addr: vip, Protocol: "TCP", Port: 80}, Verdict{})
		tx.AddElem(ips6, MapKey{Addr: vip6, Protocol: "UDP", Port: 53}, Verdict{})
		tx.AddEndpointElem(ep4, MapKey{Addr: vip, Protocol: "TCP", Port: 80}, netip.AddrPortFrom(mpEP1, 8080))
		tx.AddEndpointElem(ep4, MapKey{Addr: vip, Protocol: "TCP", Port: 80, Index: 1}, netip.AddrPortFrom(mpEP2, 8081))
		tx.AddEndpointElem(ep6, MapKey{Addr: vip6, Protocol: "UDP", Port: 53}, netip.MustParseAddrPort("[fd00:42::7]:5353"))
		tx.AddRule("services", MatchSet{Set: ips.Name, Key: ips.Key}, MatchAddr{Not: true, Prefix: netip.MustParsePrefix("10.42.0.0/16")}, VerdictStmt{Jump("svc-three")})
		tx.AddRule("services", MatchSet{Set: ips6.Name, Key: ips6.Key}, VerdictStmt{Jump("svc-three")})
		tx.AddRule("services", DNATMap{Map: ep4.Name, Mod: 2})
		tx.AddRule("services", DNATMap{Map: ep6.Name, V6: true, Mod: 1})
	}},
	{name: "endpoint elements replaced and deleted", tx: func(tx *Tx) {
		ep4 := Map{Name: "endpoints-k2", Key: KeyAddr4ProtoPortIndex}
		vip := netip.MustParseAddr("10.96.0.20")
		tx.DelElem(ep4, MapKey{Addr: vip, Protocol: "TCP", Port: 80, Index: 1})
		tx.AddEndpointElem(ep4, MapKey{Addr: vip, Protocol: "TCP", Port: 80, Index: 1}, netip.AddrPortFrom(mpEP1, 9090))
		tx.DelElem(Map{Name: "cluster-ips6", Key: KeyAddr6ProtoPort, Set: true}, MapKey{Addr: netip.MustParseAddr("fd00:96::20"), Protocol: "UDP", Port: 53})
		tx.DelElem(Map{Name: "endpoints6-k1", Key: KeyAddr6ProtoPortIndex}, MapKey{Addr: netip.MustParseAddr("fd00:96::20"), Protocol: "UDP", Port: 53})
	}},
	{name: "endpoint element with another endpoint", errno: unix.EEXIST, tx: func(tx *Tx) {
		tx.AddEndpointElem(Map{Name: "endpoints-k2", Key: KeyAddr4ProtoPortIndex}, MapKey{Addr: netip.MustParseAddr("10.96.0.20"), Protocol: "TCP", Port: 80}, netip.AddrPortFrom(mpEP2, 1))
	}},
	{name: "dnat through a missing map", errno: unix.ENOENT, tx: func(tx *Tx) {
		tx.AddRule("services", DNATMap{Map: "missing", Mod: 2})
	}},
	{name: "dnat through a map reachable from postrouting", errno: unix.EOPNOTSUPP, tx: func(tx *Tx) {
		tx.AddRule(mpNatPost.Name, DNATMap{Map: "endpoints-k2", Mod: 2})
	}},
	{name: "elements replaced, re-added and deleted; chains flushed and deleted", tx: func(tx *Tx) {
		tx.AddElem(mpNodePorts, MapKey{Protocol: "TCP", Port: 30080}, Goto("svc-web")) // same verdict: no-op
		tx.DelElem(mpNodePorts, MapKey{Protocol: "UDP", Port: 30053})
		tx.AddElem(mpNodePorts, MapKey{Protocol: "UDP", Port: 30053}, Goto("svc-three"))
		tx.DelElem(mpSvc6, MapKey{Addr: netip.MustParseAddr("fd00:96::11"), Protocol: "UDP", Port: 53})
		tx.DelElem(mpSvc4, MapKey{Addr: netip.MustParseAddr("10.96.0.12"), Protocol: "SCTP", Port: 3868})
		tx.FlushChain("ep-web-2")
		tx.AddRule("ep-web-2", MatchProtoPort{Protocol: "TCP"}, DNAT{Addr: mpEP2, Port: 9090})
		tx.FlushChain("svc-three")
		tx.AddRule("svc-three", VerdictStmt{Goto("ep-web-2")})
		tx.DelElem(mpSvc6, MapKey{Addr: mpClusterIP6, Protocol: "TCP", Port: 80})
		tx.FlushChain("svc-web")
		tx.AddRule("svc-web", MatchFamily{}, MatchRandom{Mod: 2}, VerdictStmt{Goto("ep-web-1")})
		tx.AddRule("svc-web", MatchFamily{}, VerdictStmt{Goto("ep-web-2")})
		tx.FlushChain("ep-web-6")
		tx.DelChain("ep-web-6")
	}},
	{name: "affinity set re-created with another timeout", tx: func(tx *Tx) {
		tx.FlushChain("ep-web-1")
		tx.FlushChain(mpFiltOut.Name)
		tx.DelSet(AddrSet{Name: "affinity-web-ep1"})
		tx.AddSet(AddrSet{Name: "affinity-web-ep1", Timeout: 10800 * time.Second})
		tx.DelSet(AddrSet{Name: "affinity-web-ep6"})
		tx.AddRule("ep-web-1", SetUpdate{Set: "affinity-web-ep1"})
		tx.AddRule("ep-web-1", DNAT{Addr: mpEP1, Port: 8080})
	}},
	{name: "jump to a missing chain", errno: unix.ENOENT, tx: func(tx *Tx) {
		tx.AddChain(Chain{Name: "new"})
		tx.AddRule("new", VerdictStmt{Jump("missing")})
	}},
	{name: "rule in a missing chain", errno: unix.ENOENT, tx: func(tx *Tx) {
		tx.AddElem(mpNodePorts, MapKey{Protocol: "TCP", Port: 1}, Verdict{Kind: VerdictDrop})
		tx.AddRule("missing", VerdictStmt{Verdict{Kind: VerdictAccept}})
	}},
	{name: "numgen modulus 0", errno: unix.ERANGE, tx: func(tx *Tx) {
		tx.AddRule("svc-three", MatchRandom{}, VerdictStmt{Goto("ep-web-1")})
	}},
	{name: "lookup in a missing map", errno: unix.ENOENT, tx: func(tx *Tx) {
		tx.AddRule("services", MapLookup{Map: "missing", Key: KeyProtoPort})
	}},
	{name: "lookup in a missing set", errno: unix.ENOENT, tx: func(tx *Tx) {
		tx.AddRule("svc-web", SetLookup{Set: "missing"}, VerdictStmt{Goto("ep-web-1")})
	}},
	{name: "element with another verdict", errno: unix.EEXIST, tx: func(tx *Tx) {
		tx.AddElem(mpNodePorts, MapKey{Protocol: "TCP", Port: 30080}, Goto("svc-three"))
	}},
	{name: "element in a missing map", errno: unix.ENOENT, tx: func(tx *Tx) {
		tx.AddElem(Map{Name: "missing", Key: KeyProtoPort}, MapKey{Protocol: "TCP", Port: 1}, Verdict{Kind: VerdictDrop})
	}},
	{name: "element to a missing chain", errno: unix.ENOENT, tx: func(tx *Tx) {
		tx.AddElem(mpNodePorts, MapKey{Protocol: "TCP", Port: 2}, Goto("missing"))
	}},
	{name: "delete a missing element", errno: unix.ENOENT, tx: func(tx *Tx) {
		tx.DelElem(mpNodePorts, MapKey{Protocol: "TCP", Port: 3})
	}},
	{name: "delete a chain still jumped to", errno: unix.EBUSY, tx: func(tx *Tx) {
		tx.FlushChain("svc-three")
		tx.DelChain("svc-three")
	}},
	{name: "delete a map in use", errno: unix.EBUSY, tx: func(tx *Tx) { tx.DelMap(mpSvc4) }},
	{name: "delete a set in use", errno: unix.EBUSY, tx: func(tx *Tx) { tx.DelSet(AddrSet{Name: "affinity-web-ep1"}) }},
	{name: "delete a missing chain", errno: unix.ENOENT, tx: func(tx *Tx) { tx.DelChain("missing") }},
	{name: "delete a missing map", errno: unix.ENOENT, tx: func(tx *Tx) { tx.DelMap(Map{Name: "missing", Key: KeyProtoPort}) }},
	{name: "delete a missing set", errno: unix.ENOENT, tx: func(tx *Tx) { tx.DelSet(AddrSet{Name: "missing"}) }},
	{name: "flush a missing chain", errno: unix.ENOENT, tx: func(tx *Tx) { tx.FlushChain("missing") }},
	{name: "base chain re-added with another priority", errno: unix.EOPNOTSUPP, tx: func(tx *Tx) {
		tx.AddChain(Chain{Name: mpNatPre.Name, Base: &Base{Type: ChainTypeNAT, Hook: HookPrerouting, Priority: -99}})
	}},
	{name: "masquerade reachable from prerouting", errno: unix.EOPNOTSUPP, tx: func(tx *Tx) {
		tx.AddRule("ep-web-2", Masquerade{})
	}},
	{name: "dnat reachable from postrouting", errno: unix.EOPNOTSUPP, tx: func(tx *Tx) {
		tx.AddRule(mpNatPost.Name, VerdictStmt{Jump("ep-web-1")})
	}},
	// Kernels since 5.x find the loop as too deep a jump stack (EMLINK);
	// older ones said ELOOP.
	{name: "a loop", errno: unix.EMLINK, tx: func(tx *Tx) {
		tx.AddRule("ep-web-2", VerdictStmt{Jump("svc-web")})
	}},
	// The kernel validates only what a base chain reaches.
	{name: "a loop no base chain reaches is accepted", tx: func(tx *Tx) {
		tx.AddChain(Chain{Name: "loop-a"})
		tx.AddChain(Chain{Name: "loop-b"})
		tx.AddRule("loop-a", VerdictStmt{Jump("loop-b")})
		tx.AddRule("loop-b", VerdictStmt{Goto("loop-a")})
	}},
	{name: "regular chain re-added as a base chain", errno: unix.EEXIST, tx: func(tx *Tx) {
		tx.AddChain(Chain{Name: "svc-web", Base: mpNatOut.Base})
	}},
	{name: "map re-added with another key type", errno: unix.EEXIST, tx: func(tx *Tx) {
		tx.AddMap(Map{Name: mpNodePorts.Name, Key: KeyAddr4ProtoPort})
	}},
	{name: "delete table and rebuild in one tx", tx: func(tx *Tx) {
		tx.DelTable()
		tx.AddMap(mpNodePorts)
		tx.AddChain(mpNatPre)
		tx.AddChain(Chain{Name: "svc-np"})
		tx.AddRule("svc-np", DNAT{Addr: mpEP1, Port: 80})
		tx.AddElem(mpNodePorts, MapKey{Protocol: "TCP", Port: 30080}, Goto("svc-np"))
		tx.AddRule(mpNatPre.Name, MatchAddrType{Dst: true}, MapLookup{Map: mpNodePorts.Name, Key: KeyProtoPort})
	}},
	{name: "delete table", tx: func(tx *Tx) { tx.DelTable() }},
	{name: "delete the missing table", tx: func(tx *Tx) { tx.DelTable() }},
}

// TestE2ENetlinkMatchesFake applies the same Txs to the kernel (in a
// fresh netns) and to the Fake: both accept or both refuse each one (with
// the same errno), a refused Tx leaves the kernel's table as it was, and
// after each the kernel's table (as nft lists it, normalized by
// normalizeNFT) is the Fake's Dump, and List agrees.
func TestE2ENetlinkMatchesFake(t *testing.T) {
	ns := nlNetNS(t)
	nl := NewNetlink(ns)
	f := NewFake()
	before := nftListTable(t, ns)
	for _, step := range equivSteps {
		tx := &Tx{}
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
		after := nftListTable(t, ns)
		if step.errno != 0 && after != before {
			t.Errorf("%s: the failed Tx changed the kernel's table:\n%s", step.name, after)
		}
		before = after
		if f.table != nil {
			if err := f.table.checkRefs(); err != nil {
				t.Errorf("%s: fake: %v", step.name, err)
			}
		}
		got, want := normalizeNFT(after), f.Dump()
		if got != want {
			t.Fatalf("%s: kernel and fake differ (nft %s)\nkernel (normalized):\n%s\nfake:\n%s\ndiff:\n%s", step.name, nftVersion(), got, want, nlLineDiff(got, want))
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

// nlLineDiff lists the lines only in a (-) and only in b (+).
func nlLineDiff(a, b string) string {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out []string
	for _, l := range la {
		if !slices.Contains(lb, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range lb {
		if !slices.Contains(la, l) {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

// TestE2ENetlinkLargeBatch: one Tx of 10,000 service chains, their rules
// and 10,000 map elements applies in one batch (regression: ENOBUFS or
// EMSGSIZE with small socket buffers), and one DelTable removes it.
func TestE2ENetlinkLargeBatch(t *testing.T) {
	ns := nlNetNS(t)
	nl := NewNetlink(ns)
	const n = 10000
	tx := &Tx{}
	tx.AddChain(mpNatPre)
	tx.AddMap(mpSvc4)
	tx.AddRule(mpNatPre.Name, MapLookup{Map: mpSvc4.Name, Key: mpSvc4.Key})
	for i := range n {
		name := fmt.Sprintf("svc-%05d", i)
		tx.AddChain(Chain{Name: name})
		tx.AddRule(name, MatchProtoPort{Protocol: "TCP"}, DNAT{Addr: netip.AddrFrom4([4]byte{10, 42, byte(i >> 8), byte(i)}), Port: 8080})
		tx.AddElem(mpSvc4, MapKey{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Protocol: "TCP", Port: 80}, Goto(name))
	}
	start := time.Now()
	if err := nl.Apply(tx); err != nil {
		t.Fatalf("apply %d ops: %v", len(tx.Ops), err)
	}
	t.Logf("applied %d ops in %s", len(tx.Ops), time.Since(start))
	c, err := nl.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Chains) != n+1 || !slices.Equal(c.Maps, []string{mpSvc4.Name}) {
		t.Errorf("List: %d chains, maps %v; want %d, [%s]", len(c.Chains), c.Maps, n+1, mpSvc4.Name)
	}
	nc := conn(t, ns)
	els, err := nc.GetSetElements(&nftables.Set{Table: table(), Name: mpSvc4.Name, IsMap: true, KeyType: mustKeyType(t, mpSvc4.Key), DataType: nftables.TypeVerdict})
	if err != nil {
		t.Fatal(err)
	}
	if len(els) != n {
		t.Errorf("map has %d elements, want %d", len(els), n)
	}
	tx = &Tx{}
	tx.DelTable()
	if err := nl.Apply(tx); err != nil {
		t.Fatal(err)
	}
	if c, err := nl.List(); err != nil || len(c.Chains)+len(c.Maps)+len(c.Sets) != 0 {
		t.Errorf("after DelTable: List = %+v, %v", c, err)
	}
}

func mustKeyType(t *testing.T, k KeyType) nftables.SetDatatype {
	t.Helper()
	kt, err := nlKeyType(k)
	if err != nil {
		t.Fatal(err)
	}
	return kt
}

// TestNetlinkRefusesBeforeSending: a Tx the translation refuses names the
// op and sends nothing (no netns needed: it fails before dialing).
func TestNetlinkRefusesBeforeSending(t *testing.T) {
	for _, tc := range []struct {
		name string
		tx   func(tx *Tx)
		want string
	}{
		{"unknown statement", func(tx *Tx) { tx.AddRule("c", &MatchDNATed{}) }, "op 0 (add rule to chain c): statement 0: unsupported statement type *nft.MatchDNATed"},
		{"bad protocol", func(tx *Tx) { tx.AddRule("c", MatchProtoPort{Protocol: "ICMP"}) }, `protocol "ICMP"`},
		{"dnat port 0", func(tx *Tx) { tx.AddRule("c", DNAT{Addr: mpEP1}) }, "port 0"},
		{"statement after verdict", func(tx *Tx) { tx.AddRule("c", VerdictStmt{Jump("d")}, Reject{}) }, "follows a terminal"},
		{"bad key", func(tx *Tx) { tx.AddMap(mpNodePorts); tx.AddElem(mpSvc4, MapKey{Protocol: "TCP", Port: 1}, Goto("c")) }, "op 1 (add element tcp . 1 to map service-ips)"},
		{"bad verdict", func(tx *Tx) {
			tx.AddElem(mpNodePorts, MapKey{Protocol: "TCP", Port: 1}, Verdict{Kind: VerdictAccept, Chain: "c"})
		}, "only jump and goto"},
		{"bad base chain", func(tx *Tx) { tx.AddChain(Chain{Name: "c", Base: &Base{Type: "route", Hook: HookOutput}}) }, "chain type"},
		{"empty chain name", func(tx *Tx) { tx.AddChain(Chain{}) }, "empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx := &Tx{}
			tc.tx(tx)
			// An fd that is not a netns: dialing would fail, so an error
			// that names the op shows nothing was sent.
			err := NewNetlink(-1).Apply(tx)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Apply = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// A run of thousands of elements on one map is split over several
// messages: one message's element list is limited to 64 KiB by a 16-bit
// attribute length, past which the kernel refused the whole batch with
// ENOENT (seen at 1,000 Services in one namespace).
func TestE2ENetlinkLongElementRun(t *testing.T) {
	ns := nlNetNS(t)
	nl := NewNetlink(ns)
	const n = 3000
	tx := &Tx{}
	tx.AddChain(mpNatPre)
	tx.AddMap(mpSvc4)
	tx.AddRule(mpNatPre.Name, MapLookup{Map: mpSvc4.Name, Key: mpSvc4.Key})
	name := func(i int) string {
		return fmt.Sprintf("service-ABCDEFGH-default/a-rather-long-service-name-%05d/tcp/http", i)
	}
	for i := range n {
		tx.AddChain(Chain{Name: name(i)})
	}
	for i := range n {
		tx.AddElem(mpSvc4, MapKey{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Protocol: "TCP", Port: 80}, Goto(name(i)))
	}
	if err := nl.Apply(tx); err != nil {
		t.Fatalf("apply %d elements in one run: %v", n, err)
	}
	nc := conn(t, ns)
	els, err := nc.GetSetElements(&nftables.Set{Table: table(), Name: mpSvc4.Name, IsMap: true, KeyType: mustKeyType(t, mpSvc4.Key), DataType: nftables.TypeVerdict})
	if err != nil {
		t.Fatal(err)
	}
	if len(els) != n {
		t.Errorf("map has %d elements, want %d", len(els), n)
	}
	tx = &Tx{}
	for i := range n {
		tx.DelElem(mpSvc4, MapKey{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Protocol: "TCP", Port: 80})
	}
	if err := nl.Apply(tx); err != nil {
		t.Fatalf("delete %d elements in one run: %v", n, err)
	}
}

// TestEncoderExprMatchesMarshal: the expressions the batch encoder lays
// out itself come out as google/nftables' expr.Marshal lays them out,
// wrapped in a list element as its AddRule does.
func TestEncoderExprMatchesMarshal(t *testing.T) {
	fam := byte(nftables.TableFamilyINet)
	for _, x := range []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{2}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{10, 42, 0, 0}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 1, Len: 1, CsumType: 1, CsumOffset: 10},
		&expr.Numgen{Register: 1, Modulus: 5, Type: unix.NFT_NG_RANDOM},
		&expr.Immediate{Register: 1, Data: []byte{10, 42, 0, 5}},
		&expr.Immediate{Register: 2, Data: []byte{0x1f, 0x90}},
		&expr.Verdict{Kind: expr.VerdictGoto, Chain: "service-ABCDEFGH-ns/svc/tcp/80"},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: "mark-for-masquerade"},
		&expr.Verdict{Kind: expr.VerdictAccept},
		&expr.Verdict{Kind: expr.VerdictReturn},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV6, RegAddrMin: 1},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 2, Random: true},
		&expr.Masq{FullyRandom: true},
		&expr.Lookup{SourceRegister: 1, SetName: "service-ips", IsDestRegSet: true},
	} {
		data, err := expr.Marshal(fam, x)
		if err != nil {
			t.Fatal(err)
		}
		want, err := mnl.MarshalAttributes([]mnl.Attribute{{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: data}})
		if err != nil {
			t.Fatal(err)
		}
		var e batchEncoder
		if err := e.expr(fam, x); err != nil {
			t.Fatalf("%T %+v: %v", x, x, err)
		}
		if !bytes.Equal(e.buf, want) {
			t.Errorf("%T %+v:\n got %x\nwant %x", x, x, e.buf, want)
		}
	}
}

// TestEncoderElemsMatchGoogle: the element messages the batch encoder
// lays out are the ones google/nftables' SetAddElements and
// SetDeleteElements make, but for the acknowledgement they do not ask for.
func TestEncoderElemsMatchGoogle(t *testing.T) {
	for _, tc := range []struct {
		m   Map
		ops []Op
	}{
		{mpSvc4, []Op{
			{Kind: OpAddElem, Map: mpSvc4, Key: MapKey{Addr: netip.MustParseAddr("10.96.0.10"), Protocol: "TCP", Port: 80}, Verdict: Goto("service-ABCDEFGH-ns/svc/tcp/80")},
			{Kind: OpAddElem, Map: mpSvc4, Key: MapKey{Addr: netip.MustParseAddr("10.96.0.11"), Protocol: "UDP", Port: 53}, Verdict: Verdict{Kind: VerdictDrop}},
		}},
		{mpSvc4, []Op{
			{Kind: OpDelElem, Map: mpSvc4, Key: MapKey{Addr: netip.MustParseAddr("10.96.0.10"), Protocol: "TCP", Port: 80}},
		}},
		{tableMaps[mapHairpin6], []Op{
			{Kind: OpAddElem, Map: tableMaps[mapHairpin6], Key: MapKey{Addr: netip.MustParseAddr("fd00:42::5"), Addr2: netip.MustParseAddr("fd00:42::5")}},
		}},
		{tableMaps[mapHairpin6], []Op{
			{Kind: OpDelElem, Map: tableMaps[mapHairpin6], Key: MapKey{Addr: netip.MustParseAddr("fd00:42::5"), Addr2: netip.MustParseAddr("fd00:42::5")}},
		}},
		{tableMaps[endpointsMap(false, 2)], []Op{
			{Kind: OpAddElem, Map: tableMaps[endpointsMap(false, 2)], Key: MapKey{Addr: netip.MustParseAddr("10.96.0.10"), Protocol: "TCP", Port: 80, Index: 1}, Data: netip.MustParseAddrPort("10.42.0.5:8080")},
		}},
		{tableMaps[endpointsMap(true, 1)], []Op{
			{Kind: OpAddElem, Map: tableMaps[endpointsMap(true, 1)], Key: MapKey{Addr: netip.MustParseAddr("fd00:96::10"), Protocol: "UDP", Port: 53}, Data: netip.MustParseAddrPort("[fd00:42::5]:5353")},
		}},
	} {
		kind := tc.ops[0].Kind
		els, next, err := elemRun(tc.ops, 0)
		if err != nil || next != len(tc.ops) {
			t.Fatalf("elemRun = %d, %v", next, err)
		}
		c, msgs, err := captureConn()
		if err != nil {
			t.Fatal(err)
		}
		s := &nftables.Set{Table: table(), Name: tc.m.Name, IsMap: !tc.m.Set}
		if kind == OpAddElem {
			err = c.SetAddElements(s, els)
		} else {
			err = c.SetDeleteElements(s, els)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Flush(); !errors.Is(err, errBatchMarshalled) {
			t.Fatal(err)
		}
		want := (*msgs)[1]
		var e batchEncoder
		e.elems(kind, table().Name, tc.m.Name, els)
		if got := e.buf[unix.NLMSG_HDRLEN:]; !bytes.Equal(got, want.Data) {
			t.Errorf("%s %s:\n got %x\nwant %x", tc.ops[0].String(), tc.m.Name, got, want.Data)
		}
		if typ, flags := binary.NativeEndian.Uint16(e.buf[4:]), binary.NativeEndian.Uint16(e.buf[6:]); typ != uint16(want.Header.Type) || flags != uint16(want.Header.Flags&^mnl.Acknowledge) {
			t.Errorf("%s: type %#x flags %#x, want %#x %#x", tc.ops[0].String(), typ, flags, want.Header.Type, want.Header.Flags&^mnl.Acknowledge)
		}
	}
}

// The socket that sends batches is kept between them, and a failed batch
// leaves it for a new one: the batch after a refused one applies, and its
// answer is not confused with the refused one's.
func TestE2ENetlinkKeepsItsSocket(t *testing.T) {
	nl := NewNetlink(nlNetNS(t))
	t.Cleanup(func() { nl.Close() })
	tx := &Tx{}
	tx.AddChain(Chain{Name: "a"})
	if err := nl.Apply(tx); err != nil {
		t.Fatal(err)
	}
	kept := nl.sock
	if kept == nil {
		t.Fatal("no socket kept after a batch")
	}
	tx = &Tx{}
	tx.AddChain(Chain{Name: "b"})
	if err := nl.Apply(tx); err != nil {
		t.Fatal(err)
	}
	if nl.sock != kept {
		t.Error("the second batch opened a socket of its own")
	}
	bad := &Tx{}
	bad.DelChain("missing")
	if err := nl.Apply(bad); err == nil {
		t.Fatal("deleting a missing chain: no error")
	}
	if nl.sock != nil {
		t.Error("the socket of a refused batch was kept")
	}
	tx = &Tx{}
	tx.AddChain(Chain{Name: "c"})
	if err := nl.Apply(tx); err != nil {
		t.Fatalf("the batch after a refused one: %v", err)
	}
	got, err := nl.List()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Chains, []string{"a", "b", "c"}) {
		t.Errorf("chains %v, want [a b c]", got.Chains)
	}
	if err := nl.Close(); err != nil || nl.sock != nil {
		t.Errorf("Close: %v, socket %v", err, nl.sock)
	}
}
