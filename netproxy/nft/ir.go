package nft

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// This file is the seam between what outpost wants in its table and how it
// gets there. Rules are built from the statements of stmt.go, each of
// which prints as nft(8) syntax; a Tx is one atomic batch of changes, which
// Netlink applies to the kernel (and netproxy/nfttest's Fake to memory).

// Rule is an ordered list of statements.
type Rule struct {
	Stmts []Stmt
	// Comment is kept with the rule (nft prints it as comment "…").
	Comment string
}

// String prints the rule as nft does, statements separated by spaces.
func (r Rule) String() string {
	parts := make([]string, 0, len(r.Stmts)+1)
	for _, s := range r.Stmts {
		parts = append(parts, s.String())
	}
	if r.Comment != "" {
		parts = append(parts, fmt.Sprintf("comment %q", r.Comment))
	}
	return strings.Join(parts, " ")
}

// ChainType is the type of a base chain.
type ChainType string

// Base chain types.
const (
	ChainTypeNAT    ChainType = "nat"
	ChainTypeFilter ChainType = "filter"
)

// Hook is a netfilter hook a base chain attaches to.
type Hook string

// Hooks.
const (
	HookPrerouting  Hook = "prerouting"
	HookInput       Hook = "input"
	HookForward     Hook = "forward"
	HookOutput      Hook = "output"
	HookPostrouting Hook = "postrouting"
)

// Base says how a base chain attaches; a regular chain has none.
type Base struct {
	Type     ChainType
	Hook     Hook
	Priority int32 // numeric: nft 1.0.6 rejects `priority dstnat` in output
}

// Chain is a chain of the outpost table.
type Chain struct {
	Name string
	Base *Base // nil for a regular chain
}

// KeyType is the type of a map's key.
type KeyType string

// Map key types.
const (
	// KeyAddr4ProtoPort is `ipv4_addr . inet_proto . inet_service`.
	KeyAddr4ProtoPort KeyType = "ipv4_addr . inet_proto . inet_service"
	// KeyAddr6ProtoPort is `ipv6_addr . inet_proto . inet_service`.
	KeyAddr6ProtoPort KeyType = "ipv6_addr . inet_proto . inet_service"
	// KeyProtoPort is `inet_proto . inet_service`.
	KeyProtoPort KeyType = "inet_proto . inet_service"
	// KeyAddr4Pair is `ipv4_addr . ipv4_addr`, looked up with the
	// packet's source and destination.
	KeyAddr4Pair KeyType = "ipv4_addr . ipv4_addr"
	// KeyAddr6Pair is `ipv6_addr . ipv6_addr`.
	KeyAddr6Pair KeyType = "ipv6_addr . ipv6_addr"
	// KeyAddr4ProtoPortIndex is `ipv4_addr . inet_proto . inet_service .
	// mark`: a Service address and port and the draw of a `numgen random
	// mod k` (typed mark, a 32-bit integer in host byte order, as
	// numgen's result is, which nft can list; nft 1.0.6 cannot sort the
	// elements of a plain integer field to list them). Its maps map to an
	// endpoint, `ipv4_addr . inet_service`, which DNATMap DNATs to.
	KeyAddr4ProtoPortIndex KeyType = "ipv4_addr . inet_proto . inet_service . mark"
	// KeyAddr6ProtoPortIndex is the same for IPv6, mapping to `ipv6_addr
	// . inet_service`.
	KeyAddr6ProtoPortIndex KeyType = "ipv6_addr . inet_proto . inet_service . mark"
	// KeyProtoPortIndex is `inet_proto . inet_service . mark`: a NodePort
	// and the draw of a `numgen random mod k`. Its maps map to an
	// endpoint of the family Map.V6 says, which DNATPortMap DNATs to.
	KeyProtoPortIndex KeyType = "inet_proto . inet_service . mark"
)

// Pair reports whether k is an address pair.
func (k KeyType) Pair() bool { return k == KeyAddr4Pair || k == KeyAddr6Pair }

// Endpoint reports whether k is the key of an endpoint map (whose
// elements map to an address and port, not to a verdict).
func (k KeyType) Endpoint() bool {
	return k == KeyAddr4ProtoPortIndex || k == KeyAddr6ProtoPortIndex || k == KeyProtoPortIndex
}

// AddrProtoPort reports whether k starts with a destination address,
// protocol and port, and which family the address is.
func (k KeyType) AddrProtoPort() (v6, ok bool) {
	switch k {
	case KeyAddr4ProtoPort, KeyAddr4ProtoPortIndex:
		return false, true
	case KeyAddr6ProtoPort, KeyAddr6ProtoPortIndex:
		return true, true
	}
	return false, false
}

// DataType is what the elements of map m map to, as nft prints it.
func (m Map) DataType() string {
	if v6, ok := m.endpointFamily(); ok {
		return AddrType(v6) + " . inet_service"
	}
	return "verdict"
}

// endpointFamily reports whether m is an endpoint map, and the family of
// the endpoints it maps to: the key's address's, or V6 for a key without
// one.
func (m Map) endpointFamily() (v6, ok bool) {
	switch m.Key {
	case KeyAddr4ProtoPortIndex:
		return false, true
	case KeyAddr6ProtoPortIndex:
		return true, true
	case KeyProtoPortIndex:
		return m.V6, true
	}
	return false, false
}

// CheckData checks what an element of map m maps to: an endpoint of the
// map's family in an endpoint map, nothing elsewhere.
func (m Map) CheckData(d netip.AddrPort) error {
	v6, ok := m.endpointFamily()
	if !ok {
		if d.IsValid() {
			return fmt.Errorf("map %s takes no endpoint (%s): %w", m.Key, d, unix.EINVAL)
		}
		return nil
	}
	if a := d.Addr(); !a.IsValid() || a.Is6() != v6 || a.Is4In6() || d.Port() == 0 {
		return fmt.Errorf("endpoint %s: want an %s and a port: %w", d, AddrType(v6), unix.EINVAL)
	}
	return nil
}

// AddrType is nft's name of an address type: ipv4_addr or ipv6_addr.
func AddrType(v6 bool) string {
	if v6 {
		return "ipv6_addr"
	}
	return "ipv4_addr"
}

// MaxNameLen is the longest chain, set or map name the kernel takes
// (NFT_NAME_MAXLEN, 256 with the NUL).
const MaxNameLen = 255

// CheckName checks a chain, set or map name as the kernel does; what
// says which it is.
func CheckName(what, name string) error {
	if name == "" {
		return fmt.Errorf("%s name is empty: %w", what, unix.EINVAL)
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("%s name is %d bytes, the kernel takes at most %d: %w", what, len(name), MaxNameLen, unix.ENAMETOOLONG)
	}
	return nil
}

// Map is a named verdict map or, with Set, a plain set of keys whose
// elements carry no verdict and which MatchSet tests packets against. A
// map with an endpoint key (KeyAddr4ProtoPortIndex,
// KeyAddr6ProtoPortIndex, KeyProtoPortIndex) maps to addresses and ports
// instead of verdicts.
type Map struct {
	Name string
	Key  KeyType
	Set  bool
	// V6 is the family of the endpoints a map with key KeyProtoPortIndex
	// maps to (the key has no address to say it).
	V6 bool
}

// MapKey is a key of a verdict map; Addr is unset for KeyProtoPort and
// KeyProtoPortIndex. A pair key (KeyAddr4Pair, KeyAddr6Pair) is Addr .
// Addr2, with no protocol or port. Index is the numgen draw of an
// endpoint key, and zero in every other.
type MapKey struct {
	Addr     netip.Addr
	Addr2    netip.Addr
	Protocol string // TCP, UDP or SCTP
	Port     uint16
	Index    uint32
}

// String prints the key as nft does: `10.0.0.1 . tcp . 80`, or
// `10.42.0.5 . 10.42.0.5` for a pair. The index of an endpoint key is
// printed when it is not zero (Format prints it always).
func (k MapKey) String() string {
	s := k.format()
	if k.Index != 0 {
		s += " . " + fmt.Sprint(k.Index)
	}
	return s
}

// Format prints the key as nft prints a key of type kt (the draw of an
// endpoint key as a mark, 0x00000001).
func (k MapKey) Format(kt KeyType) string {
	if kt.Endpoint() {
		return fmt.Sprintf("%s . 0x%08x", k.format(), k.Index)
	}
	return k.format()
}

func (k MapKey) format() string {
	if k.Addr2.IsValid() {
		return k.Addr.String() + " . " + k.Addr2.String()
	}
	s := strings.ToLower(k.Protocol) + " . " + fmt.Sprint(k.Port)
	if k.Addr.IsValid() {
		s = k.Addr.String() + " . " + s
	}
	return s
}

// AddrSet is a named dynamic set of source addresses with a timeout, for
// session affinity.
type AddrSet struct {
	Name    string
	V6      bool
	Timeout time.Duration
}

// VerdictKind is what a verdict does.
type VerdictKind string

// Verdicts.
const (
	VerdictAccept VerdictKind = "accept"
	VerdictDrop   VerdictKind = "drop"
	VerdictReturn VerdictKind = "return"
	VerdictJump   VerdictKind = "jump"
	VerdictGoto   VerdictKind = "goto"
)

// Verdict is a verdict; Chain is set for jump and goto.
type Verdict struct {
	Kind  VerdictKind
	Chain string
}

// String prints `jump chain`, `goto chain` or the bare verdict.
func (v Verdict) String() string {
	if v.Chain != "" {
		return string(v.Kind) + " " + v.Chain
	}
	return string(v.Kind)
}

// Jump returns the verdict `jump chain`.
func Jump(chain string) Verdict { return Verdict{Kind: VerdictJump, Chain: chain} }

// Goto returns the verdict `goto chain`.
func Goto(chain string) Verdict { return Verdict{Kind: VerdictGoto, Chain: chain} }

// Tx is one batch of changes to the outpost table, applied atomically
// (by Netlink, or by a fake in tests): either every op takes effect or none does. Ops apply in order;
// the table itself is created by the first op if it does not exist.
type Tx struct {
	Ops []Op
}

// OpKind is what an Op does.
type OpKind int

// Op kinds.
const (
	OpAddChain   OpKind = iota + 1 // create Chain if missing
	OpFlushChain                   // remove every rule of Chain
	OpDelChain                     // delete Chain (it must be empty and unreferenced)
	OpAddRule                      // append Rule to Chain
	OpAddMap                       // create Map if missing
	OpDelMap                       // delete Map
	OpAddElem                      // add Key: Verdict to Map (replace is delete then add)
	OpDelElem                      // delete Key from Map
	OpAddSet                       // create AddrSet if missing
	OpDelSet                       // delete AddrSet
	OpDelTable                     // delete the whole table and everything in it
)

// Op is one change. Which fields matter depends on Kind.
type Op struct {
	Kind    OpKind
	Chain   Chain   // OpAddChain, OpFlushChain, OpDelChain, OpAddRule (Name)
	Rule    Rule    // OpAddRule
	Map     Map     // OpAddMap, OpDelMap, OpAddElem, OpDelElem (Name, Key)
	Key     MapKey  // OpAddElem, OpDelElem
	Verdict Verdict // OpAddElem to a verdict map
	// Data is what an OpAddElem to an endpoint map maps its key to.
	Data netip.AddrPort
	Set  AddrSet // OpAddSet, OpDelSet
}

// String names the op for an error: `add rule to chain svc-x`.
func (op Op) String() string {
	switch op.Kind {
	case OpAddChain:
		return "add chain " + op.Chain.Name
	case OpFlushChain:
		return "flush chain " + op.Chain.Name
	case OpDelChain:
		return "delete chain " + op.Chain.Name
	case OpAddRule:
		return "add rule to chain " + op.Chain.Name
	case OpAddMap:
		return "add map " + op.Map.Name
	case OpDelMap:
		return "delete map " + op.Map.Name
	case OpAddElem:
		return fmt.Sprintf("add element %s to map %s", op.Key, op.Map.Name)
	case OpDelElem:
		return fmt.Sprintf("delete element %s from map %s", op.Key, op.Map.Name)
	case OpAddSet:
		return "add set " + op.Set.Name
	case OpDelSet:
		return "delete set " + op.Set.Name
	case OpDelTable:
		return "delete table " + TableName
	}
	return fmt.Sprintf("op kind %d", int(op.Kind))
}

// AddChain appends OpAddChain.
func (tx *Tx) AddChain(c Chain) { tx.Ops = append(tx.Ops, Op{Kind: OpAddChain, Chain: c}) }

// FlushChain appends OpFlushChain.
func (tx *Tx) FlushChain(name string) {
	tx.Ops = append(tx.Ops, Op{Kind: OpFlushChain, Chain: Chain{Name: name}})
}

// DelChain appends OpDelChain.
func (tx *Tx) DelChain(name string) {
	tx.Ops = append(tx.Ops, Op{Kind: OpDelChain, Chain: Chain{Name: name}})
}

// AddRule appends OpAddRule.
func (tx *Tx) AddRule(chain string, stmts ...Stmt) {
	tx.Ops = append(tx.Ops, Op{Kind: OpAddRule, Chain: Chain{Name: chain}, Rule: Rule{Stmts: stmts}})
}

// AddMap appends OpAddMap.
func (tx *Tx) AddMap(m Map) { tx.Ops = append(tx.Ops, Op{Kind: OpAddMap, Map: m}) }

// DelMap appends OpDelMap.
func (tx *Tx) DelMap(m Map) { tx.Ops = append(tx.Ops, Op{Kind: OpDelMap, Map: m}) }

// AddElem appends OpAddElem.
func (tx *Tx) AddElem(m Map, k MapKey, v Verdict) {
	tx.Ops = append(tx.Ops, Op{Kind: OpAddElem, Map: m, Key: k, Verdict: v})
}

// AddEndpointElem appends OpAddElem of k: d to the endpoint map m.
func (tx *Tx) AddEndpointElem(m Map, k MapKey, d netip.AddrPort) {
	tx.Ops = append(tx.Ops, Op{Kind: OpAddElem, Map: m, Key: k, Data: d})
}

// DelElem appends OpDelElem.
func (tx *Tx) DelElem(m Map, k MapKey) {
	tx.Ops = append(tx.Ops, Op{Kind: OpDelElem, Map: m, Key: k})
}

// AddSet appends OpAddSet.
func (tx *Tx) AddSet(s AddrSet) { tx.Ops = append(tx.Ops, Op{Kind: OpAddSet, Set: s}) }

// DelSet appends OpDelSet.
func (tx *Tx) DelSet(s AddrSet) { tx.Ops = append(tx.Ops, Op{Kind: OpDelSet, Set: s}) }

// DelTable appends OpDelTable.
func (tx *Tx) DelTable() { tx.Ops = append(tx.Ops, Op{Kind: OpDelTable}) }

// Contents lists what the table holds now, by name; a full resync uses it
// to delete chains, maps and sets it no longer wants.
type Contents struct {
	Chains []string
	Maps   []string
	Sets   []string
}
