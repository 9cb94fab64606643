package nft

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/outpost-edge/outpost/internal/netnstest"
)

// nlNetNS returns a fresh network namespace (netnstest.New), skipping the
// test when not root or when this kernel (or emulator) has no nftables
// netlink (any other failure fails it); nfttest.NetNS, for this package's
// internal tests.
func nlNetNS(t *testing.T) int {
	t.Helper()
	ns := netnstest.New(t)
	if err := Available(); errors.Is(err, unix.EPROTONOSUPPORT) {
		t.Skipf("this kernel has no nftables netlink: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	return ns
}

func conn(t *testing.T, nsfd int) *nftables.Conn {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(nsfd))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Fixtures (as in netproxy/nfttest's fake_test.go).
var (
	mpNatPre    = Chain{Name: "nat-prerouting", Base: &Base{Type: ChainTypeNAT, Hook: HookPrerouting, Priority: -100}}
	mpSvc4      = Map{Name: "service-ips", Key: KeyAddr4ProtoPort}
	mpNodePorts = Map{Name: "service-nodeports", Key: KeyProtoPort}
	mpEP1       = netip.MustParseAddr("10.42.0.5")
)

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
