package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file holds the statements rules are made of, one block each: the
// type, how nft(8) writes it (String), what it is (Info: terminal or
// not, the address family it loads, the chains, maps and sets it names,
// where it may run), and its netlink expressions (encode). A new
// statement is a new block here and an entry in netproxy/nfttest's
// stmt.go, which says how the Fake checks it against its table and what
// it does to a traced packet (TestEveryStatementHasAFake fails until it
// has one). The Fake's side stays out of this package so that the binary
// holds no test code; Info is what the two sides share.

// Stmt is one statement of a rule. Only this package's statement types
// (not pointers to them) are statements.
type Stmt interface {
	// String prints the statement in nft syntax.
	String() string
	// Info says what the statement is, apart from what it matches or
	// does to a packet.
	Info() StmtInfo
	// encode appends the statement's netlink expressions.
	encode(e *ruleEncoder) error
}

// StmtInfo is what a statement is: what the kernel checks of a rule
// beyond its own expressions, and what nft(8) leaves out when it lists
// the rule.
type StmtInfo struct {
	// Terminal: the statement ends the rule's evaluation when it is
	// reached (a vmap when its lookup hits); no statement may follow it.
	Terminal bool
	// Family is the family of the network header fields the statement
	// loads, 4 or 6 (in an inet table `meta nfproto` must come first);
	// 0 when it loads none.
	Family int
	// Chain is the chain the statement jumps or goes to; Map the map or
	// plain set it looks up; Set the address set it tests or updates.
	Chain, Map, Set string
	// NAT: the statement runs only in chains of type nat. Hooks, when
	// set, are the only hooks it may be reached from.
	NAT   bool
	Hooks []Hook
}

// AllowedIn reports, as an error, whether a statement of info may run in
// a chain reached from a base chain of type typ on hook: `only in nat
// prerouting and output chains`.
func (info StmtInfo) AllowedIn(typ ChainType, hook Hook) error {
	if (!info.NAT || typ == ChainTypeNAT) && (info.Hooks == nil || slices.Contains(info.Hooks, hook)) {
		return nil
	}
	where := make([]string, len(info.Hooks))
	for i, h := range info.Hooks {
		where[i] = string(h)
	}
	s := strings.Join(where, ", ")
	if n := len(where); n > 1 {
		s = strings.Join(where[:n-1], ", ") + " and " + where[n-1]
	}
	if info.NAT {
		s = "nat " + s
	}
	return fmt.Errorf("only in %s chains: %w", s, unix.EOPNOTSUPP)
}

// The hooks statements are restricted to (shared, so Info allocates
// nothing).
var (
	dnatHooks       = []Hook{HookPrerouting, HookOutput}
	masqueradeHooks = []Hook{HookPostrouting}
	rejectHooks     = []Hook{HookInput, HookForward, HookOutput}
)

// family is 6 for IPv6 and 4 for IPv4.
func family(v6 bool) int {
	if v6 {
		return 6
	}
	return 4
}

// keyFamily is the family of the address fields of a key; 0 for none.
func keyFamily(k KeyType) int {
	if k.Pair() {
		return family(k == KeyAddr6Pair)
	}
	if v6, ok := k.AddrProtoPort(); ok {
		return family(v6)
	}
	return 0
}

// Statements. Address matches take the family from the address or prefix.

// MatchFamily is `meta nfproto ipv4|ipv6`.
type MatchFamily struct{ V6 bool }

func (m MatchFamily) String() string { return "meta nfproto " + ipv(m.V6) }

// Info of MatchFamily: it loads no address; it sets the family.
func (m MatchFamily) Info() StmtInfo { return StmtInfo{} }

func (m MatchFamily) encode(e *ruleEncoder) error {
	e.add(matchFamily(!m.V6)...)
	e.family = family(m.V6)
	return nil
}

// MatchAddr is `ip saddr|daddr [!=] prefix`.
type MatchAddr struct {
	Dst    bool
	Not    bool
	Prefix netip.Prefix
}

func (m MatchAddr) String() string {
	dir := "saddr"
	if m.Dst {
		dir = "daddr"
	}
	op := ""
	if m.Not {
		op = "!= "
	}
	p := m.Prefix.String()
	if m.Prefix.IsSingleIP() {
		p = m.Prefix.Addr().String()
	}
	return fmt.Sprintf("%s %s %s%s", ipFamily(m.Prefix.Addr().Is6()), dir, op, p)
}

// Info of MatchAddr: it loads an address of the prefix's family.
func (m MatchAddr) Info() StmtInfo { return StmtInfo{Family: family(m.Prefix.Addr().Is6())} }

func (m MatchAddr) encode(e *ruleEncoder) error {
	if !m.Prefix.IsValid() {
		return fmt.Errorf("invalid prefix")
	}
	op := expr.CmpOpEq
	if m.Not {
		op = expr.CmpOpNeq
	}
	e.add(matchAddr(m.Dst, op, m.Prefix)...)
	return nil
}

// MatchProtoPort is `meta l4proto <proto> th dport <port>`; Port 0 matches
// the protocol only.
type MatchProtoPort struct {
	Protocol string // TCP, UDP or SCTP
	Port     uint16
}

func (m MatchProtoPort) String() string {
	s := "meta l4proto " + strings.ToLower(m.Protocol)
	if m.Port != 0 {
		s += fmt.Sprintf(" th dport %d", m.Port)
	}
	return s
}

// Info of MatchProtoPort: nothing but its match.
func (m MatchProtoPort) Info() StmtInfo { return StmtInfo{} }

func (m MatchProtoPort) encode(e *ruleEncoder) error {
	proto, ok := l4proto[strings.ToUpper(m.Protocol)]
	if !ok {
		return fmt.Errorf("protocol %q: want TCP, UDP or SCTP", m.Protocol)
	}
	if m.Port != 0 {
		e.add(matchPort(strings.ToUpper(m.Protocol), m.Port)...)
		return nil
	}
	e.add(
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: nlReg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: nlReg1, Data: []byte{proto}},
	)
	return nil
}

// MatchAddrType is `fib saddr|daddr type local`.
type MatchAddrType struct {
	Dst bool
	Not bool
}

func (m MatchAddrType) String() string {
	dir, op := "saddr", ""
	if m.Dst {
		dir = "daddr"
	}
	if m.Not {
		op = "!= "
	}
	return fmt.Sprintf("fib %s type %slocal", dir, op)
}

// Info of MatchAddrType: nothing but its match.
func (m MatchAddrType) Info() StmtInfo { return StmtInfo{} }

func (m MatchAddrType) encode(e *ruleEncoder) error {
	op := expr.CmpOpEq
	if m.Not {
		op = expr.CmpOpNeq
	}
	e.add(
		&expr.Fib{Register: nlReg1, FlagSADDR: !m.Dst, FlagDADDR: m.Dst, ResultADDRTYPE: true},
		&expr.Cmp{Op: op, Register: nlReg1, Data: binary.NativeEndian.AppendUint32(nil, unix.RTN_LOCAL)},
	)
	return nil
}

// MatchMark is `meta mark & <bit> != 0` (Set) or `== 0`.
type MatchMark struct {
	Bit uint32
	Set bool
}

func (m MatchMark) String() string {
	op := "=="
	if m.Set {
		op = "!="
	}
	return fmt.Sprintf("meta mark & 0x%08x %s 0x00000000", m.Bit, op)
}

// Info of MatchMark: nothing but its match.
func (m MatchMark) Info() StmtInfo { return StmtInfo{} }

func (m MatchMark) encode(e *ruleEncoder) error {
	op := expr.CmpOpEq
	if m.Set {
		op = expr.CmpOpNeq
	}
	e.add(
		&expr.Meta{Key: expr.MetaKeyMARK, Register: nlReg1},
		&expr.Bitwise{SourceRegister: nlReg1, DestRegister: nlReg1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, m.Bit), Xor: make([]byte, 4)},
		&expr.Cmp{Op: op, Register: nlReg1, Data: make([]byte, 4)},
	)
	return nil
}

// SetMark is `meta mark set meta mark | <or>` (Xor false) or
// `meta mark set meta mark ^ <bit>` (Xor true).
type SetMark struct {
	Bit uint32
	Xor bool
}

func (s SetMark) String() string {
	op := "|"
	if s.Xor {
		op = "^"
	}
	return fmt.Sprintf("meta mark set meta mark %s 0x%08x", op, s.Bit)
}

// Info of SetMark: nothing but its effect.
func (s SetMark) Info() StmtInfo { return StmtInfo{} }

func (s SetMark) encode(e *ruleEncoder) error {
	// mark | bit is (mark & ^bit) ^ bit; mark ^ bit is (mark & ~0) ^ bit.
	mask := ^s.Bit
	if s.Xor {
		mask = ^uint32(0)
	}
	e.add(
		&expr.Meta{Key: expr.MetaKeyMARK, Register: nlReg1},
		&expr.Bitwise{SourceRegister: nlReg1, DestRegister: nlReg1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, mask), Xor: binary.NativeEndian.AppendUint32(nil, s.Bit)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: nlReg1},
	)
	return nil
}

// MatchDNATed is `ct status dnat`.
type MatchDNATed struct{}

func (MatchDNATed) String() string { return "ct status dnat" }

// Info of MatchDNATed: nothing but its match.
func (MatchDNATed) Info() StmtInfo { return StmtInfo{} }

func (MatchDNATed) encode(e *ruleEncoder) error {
	e.add(matchDNATed()...)
	return nil
}

// MapLookup is `ip daddr . meta l4proto . th dport vmap @map` (or without
// the address for KeyProtoPort maps, or `ip saddr . ip daddr vmap @map`
// for pair maps).
type MapLookup struct {
	Map string
	Key KeyType
}

func (m MapLookup) String() string {
	switch m.Key {
	case KeyAddr4Pair:
		return "ip saddr . ip daddr vmap @" + m.Map
	case KeyAddr6Pair:
		return "ip6 saddr . ip6 daddr vmap @" + m.Map
	case KeyAddr4ProtoPort:
		return "ip daddr . meta l4proto . th dport vmap @" + m.Map
	case KeyAddr6ProtoPort:
		return "ip6 daddr . meta l4proto . th dport vmap @" + m.Map
	}
	return "meta l4proto . th dport vmap @" + m.Map
}

// Info of MapLookup: terminal when it hits; it loads the key's addresses
// and looks up Map.
func (m MapLookup) Info() StmtInfo {
	return StmtInfo{Terminal: true, Family: keyFamily(m.Key), Map: m.Map}
}

func (m MapLookup) encode(e *ruleEncoder) error {
	x, err := nlMapLookup(m)
	if err != nil {
		return err
	}
	e.add(x...)
	return nil
}

// MatchRandom is `numgen random mod N 0`: it matches one packet in N, at
// random. A chain balances over k endpoints with k rules, the i-th (from
// 0) matching with MatchRandom{Mod: k-i} before its goto and the last
// with none, so each endpoint is chosen with probability 1/k, as
// iptables' statistic cascade does. It replaces a `numgen random mod k
// vmap { … }` whose anonymous map would make the kernel walk the whole
// transaction once per Service (__nft_set_trans_bind), so that a cold
// sync of 10,000 Services took minutes.
type MatchRandom struct{ Mod uint32 }

func (m MatchRandom) String() string { return fmt.Sprintf("numgen random mod %d 0", m.Mod) }

// Info of MatchRandom: nothing but its match.
func (m MatchRandom) Info() StmtInfo { return StmtInfo{} }

func (m MatchRandom) encode(e *ruleEncoder) error {
	e.add(
		&expr.Numgen{Register: nlReg1, Modulus: m.Mod, Type: unix.NFT_NG_RANDOM},
		&expr.Cmp{Op: expr.CmpOpEq, Register: nlReg1, Data: make([]byte, 4)},
	)
	return nil
}

// MatchSet is `ip saddr . ip daddr @set`: the packet's source and
// destination are an element of a plain set (Map.Set) with a pair key;
// or, with an address, protocol and port key, `ip daddr . meta l4proto .
// th dport @set`; or, with a protocol and port key, `meta l4proto . th
// dport @set`.
type MatchSet struct {
	Set string
	Key KeyType // KeyAddr4Pair, KeyAddr6Pair, KeyAddr4ProtoPort, KeyAddr6ProtoPort or KeyProtoPort
}

func (m MatchSet) String() string {
	if v6, ok := m.Key.AddrProtoPort(); ok {
		return ipFamily(v6) + " daddr . meta l4proto . th dport @" + m.Set
	}
	if m.Key == KeyProtoPort {
		return "meta l4proto . th dport @" + m.Set
	}
	f := ipFamily(m.Key == KeyAddr6Pair)
	return f + " saddr . " + f + " daddr @" + m.Set
}

// Info of MatchSet: it loads the key's addresses and looks up Set (a
// plain set, named like a map).
func (m MatchSet) Info() StmtInfo { return StmtInfo{Family: keyFamily(m.Key), Map: m.Set} }

func (m MatchSet) encode(e *ruleEncoder) error {
	if _, addrKey := m.Key.AddrProtoPort(); !m.Key.Pair() && m.Key != KeyProtoPort && (!addrKey || m.Key.Endpoint()) {
		return fmt.Errorf("set key %s is neither an address pair nor [address,] protocol and port", m.Key)
	}
	x, err := nlMapLookup(MapLookup{Map: m.Set, Key: m.Key})
	if err != nil {
		return err
	}
	// The same loads, and a lookup that only matches.
	x[len(x)-1] = &expr.Lookup{SourceRegister: nlReg1, SetName: m.Set}
	e.add(x...)
	return nil
}

// SetLookup is `ip saddr @set` (session affinity: the client was sent to
// this set's endpoint before and has not timed out).
type SetLookup struct {
	Set string
	V6  bool
}

func (s SetLookup) String() string { return ipFamily(s.V6) + " saddr @" + s.Set }

// Info of SetLookup: it loads the source address and tests Set.
func (s SetLookup) Info() StmtInfo { return StmtInfo{Family: family(s.V6), Set: s.Set} }

func (s SetLookup) encode(e *ruleEncoder) error {
	e.add(
		nlLoadSaddr(s.V6),
		&expr.Lookup{SourceRegister: nlReg1, SetName: s.Set},
	)
	return nil
}

// SetUpdate is `update @set { ip saddr }`: adds or refreshes the client in
// the set with the set's timeout.
type SetUpdate struct {
	Set string
	V6  bool
}

func (s SetUpdate) String() string { return "update @" + s.Set + " { " + ipFamily(s.V6) + " saddr }" }

// Info of SetUpdate: it loads the source address and updates Set.
func (s SetUpdate) Info() StmtInfo { return StmtInfo{Family: family(s.V6), Set: s.Set} }

func (s SetUpdate) encode(e *ruleEncoder) error {
	e.add(
		nlLoadSaddr(s.V6),
		// No timeout: the element gets (or is refreshed to) the set's.
		&expr.Dynset{SrcRegKey: nlReg1, SetName: s.Set, Operation: uint32(unix.NFT_DYNSET_OP_UPDATE)},
	)
	return nil
}

// DNAT is `dnat ip to addr:port`.
type DNAT struct {
	Addr netip.Addr
	Port uint16
}

func (d DNAT) String() string {
	return fmt.Sprintf("dnat %s to %s", ipFamily(d.Addr.Is6()), netip.AddrPortFrom(d.Addr, d.Port))
}

// Info of DNAT: terminal, in nat prerouting and output chains only.
func (d DNAT) Info() StmtInfo { return StmtInfo{Terminal: true, NAT: true, Hooks: dnatHooks} }

func (d DNAT) encode(e *ruleEncoder) error {
	if !d.Addr.IsValid() || d.Addr.Is4In6() {
		return fmt.Errorf("want an IPv4 or IPv6 address")
	}
	if d.Port == 0 {
		return fmt.Errorf("port 0")
	}
	family := uint32(unix.NFPROTO_IPV6)
	if d.Addr.Is4() {
		family = unix.NFPROTO_IPV4
	}
	e.add(
		&expr.Immediate{Register: nlReg1, Data: d.Addr.AsSlice()},
		&expr.Immediate{Register: nlReg2, Data: binary.BigEndian.AppendUint16(nil, d.Port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: family, RegAddrMin: nlReg1, RegProtoMin: nlReg2, Specified: true},
	)
	return nil
}

// DNATMap is `dnat ip to ip daddr . meta l4proto . th dport . numgen
// random mod <Mod> map @<Map>`: it draws one of Mod endpoints at random
// and DNATs to the address and port the endpoint map (key
// KeyAddr4ProtoPortIndex, or KeyAddr6ProtoPortIndex with V6) holds for
// the packet's destination, protocol, port and draw. When the map holds
// no such element the rule does not match and the next one runs. One
// rule serves every Service with Mod endpoints, so adding, changing or
// removing such a Service changes map elements only, which the kernel
// does not check the table for at commit (a new rule or jump makes it
// walk every chain).
type DNATMap struct {
	Map string
	V6  bool
	Mod uint32
}

func (d DNATMap) String() string {
	f := ipFamily(d.V6)
	return fmt.Sprintf("dnat %s to %s daddr . meta l4proto . th dport . numgen random mod %d map @%s", f, f, d.Mod, d.Map)
}

// Info of DNATMap: terminal, in nat prerouting and output chains only; it
// loads the destination address and looks up Map.
func (d DNATMap) Info() StmtInfo {
	return StmtInfo{Terminal: true, Family: family(d.V6), Map: d.Map, NAT: true, Hooks: dnatHooks}
}

func (d DNATMap) encode(e *ruleEncoder) error {
	if d.Mod == 0 {
		return fmt.Errorf("numgen modulus 0")
	}
	// The key (address, protocol, port, draw) in consecutive 32-bit
	// registers from register 1; the lookup writes the endpoint's address
	// there and its port in the register after the address, where nat
	// reads them.
	key := KeyAddr4ProtoPort
	family, ngReg, portReg := uint32(unix.NFPROTO_IPV4), uint32(nlRegV4Port+1), uint32(nlRegV4Proto)
	if d.V6 {
		key = KeyAddr6ProtoPort
		family, ngReg, portReg = unix.NFPROTO_IPV6, nlRegV6Port+1, nlReg2
	}
	x, err := nlMapLookup(MapLookup{Map: d.Map, Key: key})
	if err != nil {
		return err
	}
	e.add(x[:len(x)-1]...)
	e.add(
		&expr.Numgen{Register: ngReg, Modulus: d.Mod, Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: nlReg1, SetName: d.Map, IsDestRegSet: true, DestRegister: nlReg1},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: family, RegAddrMin: nlReg1, RegProtoMin: portReg, Specified: true},
	)
	return nil
}

// DNATPortMap is `meta nfproto ipv4 dnat ip to meta l4proto . th dport .
// numgen random mod <Mod> map @<Map>`: DNATMap for a NodePort, whose
// endpoint map (key KeyProtoPortIndex) holds the endpoints of the family
// V6 says for the packet's protocol, port and draw. The rule matches only
// packets of that family.
type DNATPortMap struct {
	Map string
	V6  bool
	Mod uint32
}

// String prints the family match that comes with the statement (nft
// lists it: no address load implies it).
func (d DNATPortMap) String() string {
	return fmt.Sprintf("meta nfproto %s dnat %s to meta l4proto . th dport . numgen random mod %d map @%s", ipv(d.V6), ipFamily(d.V6), d.Mod, d.Map)
}

// Info of DNATPortMap: terminal, in nat prerouting and output chains
// only; it needs the family and looks up Map.
func (d DNATPortMap) Info() StmtInfo {
	return StmtInfo{Terminal: true, Family: family(d.V6), Map: d.Map, NAT: true, Hooks: dnatHooks}
}

func (d DNATPortMap) encode(e *ruleEncoder) error {
	if d.Mod == 0 {
		return fmt.Errorf("numgen modulus 0")
	}
	// The key (protocol, port, draw) in the 32-bit registers from
	// register 1 on; the lookup writes the endpoint's address there and
	// its port in the register after the address, where nat reads them.
	family, portReg := uint32(unix.NFPROTO_IPV4), uint32(nlRegPort)
	if d.V6 {
		family, portReg = unix.NFPROTO_IPV6, nlReg2
	}
	x, err := nlMapLookup(MapLookup{Map: d.Map, Key: KeyProtoPort})
	if err != nil {
		return err
	}
	e.add(x[:len(x)-1]...)
	e.add(
		&expr.Numgen{Register: nlRegPort + 1, Modulus: d.Mod, Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: nlReg1, SetName: d.Map, IsDestRegSet: true, DestRegister: nlReg1},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: family, RegAddrMin: nlReg1, RegProtoMin: portReg, Specified: true},
	)
	return nil
}

// Masquerade is `masquerade [fully-random]`.
type Masquerade struct{ FullyRandom bool }

func (m Masquerade) String() string {
	if m.FullyRandom {
		return "masquerade fully-random"
	}
	return "masquerade"
}

// Info of Masquerade: terminal, in nat postrouting chains only.
func (m Masquerade) Info() StmtInfo {
	return StmtInfo{Terminal: true, NAT: true, Hooks: masqueradeHooks}
}

func (m Masquerade) encode(e *ruleEncoder) error {
	e.add(&expr.Masq{FullyRandom: m.FullyRandom})
	return nil
}

// Reject is `reject` (ICMP port unreachable, which a TCP client sees as
// connection refused).
type Reject struct{}

func (Reject) String() string { return "reject" }

// Info of Reject: terminal, reached from input, forward and output hooks
// only (where kube-proxy uses it; recent kernels also take prerouting).
func (Reject) Info() StmtInfo { return StmtInfo{Terminal: true, Hooks: rejectHooks} }

func (Reject) encode(e *ruleEncoder) error {
	e.add(&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH})
	return nil
}

// VerdictStmt ends a rule with a verdict.
type VerdictStmt struct{ Verdict Verdict }

func (v VerdictStmt) String() string { return v.Verdict.String() }

// Info of VerdictStmt: terminal; a jump or goto names its chain.
func (v VerdictStmt) Info() StmtInfo { return StmtInfo{Terminal: true, Chain: v.Verdict.Chain} }

func (v VerdictStmt) encode(e *ruleEncoder) error {
	x, err := nlVerdict(v.Verdict)
	if err != nil {
		return err
	}
	e.add(x)
	return nil
}

func stmtString(s Stmt) string {
	if s == nil {
		return "nil"
	}
	return s.String()
}

func ipv(v6 bool) string {
	if v6 {
		return "ipv6"
	}
	return "ipv4"
}

func ipFamily(v6 bool) string {
	if v6 {
		return "ip6"
	}
	return "ip"
}
