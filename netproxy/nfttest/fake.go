package nfttest

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/outpost-edge/outpost/netproxy/nft"
)

// Fake is an in-memory proxy.Ruleset for tests. Apply is transactional like the
// kernel: every op of a Tx is validated and applied to a copy, and on the
// first error nothing changes; the error names the op (index, kind,
// object). It refuses what the kernel refuses, with the kernel's errno
// (errors.Is(err, unix.ENOENT) holds for both; TestE2ENetlinkMatchesFake
// checks each case against nft.Netlink), including what the kernel checks
// at commit: loops and jump depth, and dnat, masquerade and reject
// reachable from a base chain whose hook or type does not allow them. It
// is stricter than the kernel where the Tx contract is:
//
//   - OpDelChain of a chain that still has rules fails (EBUSY; the kernel
//     would delete the rules with it);
//   - OpAddSet of an existing set with another timeout fails (EEXIST;
//     recent kernels update the timeout, older ones keep the old one and
//     say nothing, so delete and re-create the set instead);
//   - a statement after a terminal one (verdict, vmap, numgen, dnat,
//     masquerade, reject), which would never run, fails (EINVAL);
//   - reject is allowed only where kube-proxy uses it, in chains reached
//     from input, forward and output hooks (EOPNOTSUPP; recent kernels
//     also take prerouting).
//
// Dump prints the table as `nft list table inet outpost` does, with sets,
// maps, chains and map elements sorted; Trace (trace.go) pushes a packet
// through it.
type Fake struct {
	mu    sync.Mutex
	table *fakeTable // nil: no table
	txs   int
	ops   int
	last  []nft.Op
	// affinity holds the addresses tests put in sets, by set name.
	affinity map[string]map[netip.Addr]bool
}

// NewFake returns a Fake without a table.
func NewFake() *Fake {
	return &Fake{affinity: map[string]map[netip.Addr]bool{}}
}

type fakeTable struct {
	chains map[string]*fakeChain
	maps   map[string]*fakeMap
	sets   map[string]*nft.AddrSet
	// Who refers to what, with counts: ruleRefs[c][p] counts the rules of
	// chain p that jump or go to chain c (verdicts and numgen);
	// elemRefs[c][m] the elements of map m that do; mapUsers[m][p] the
	// rules of chain p that look up map m; setRefs[s] the rules that use
	// set s.
	ruleRefs map[string]map[string]int
	elemRefs map[string]map[string]int
	mapUsers map[string]map[string]int
	setRefs  map[string]int
}

type fakeChain struct {
	base  *nft.Base
	rules []nft.Rule
}

type fakeMap struct {
	key   nft.KeyType
	set   bool // a plain set: elements have no verdict
	v6    bool // the family of a KeyProtoPortIndex map's endpoints
	elems map[nft.MapKey]fakeElem
}

// fakeElem is what an element maps to: a verdict, or (in an endpoint
// map) an address and port.
type fakeElem struct {
	nft.Verdict
	data netip.AddrPort
}

func newFakeTable() *fakeTable {
	return &fakeTable{
		chains:   map[string]*fakeChain{},
		maps:     map[string]*fakeMap{},
		sets:     map[string]*nft.AddrSet{},
		ruleRefs: map[string]map[string]int{},
		elemRefs: map[string]map[string]int{},
		mapUsers: map[string]map[string]int{},
		setRefs:  map[string]int{},
	}
}

// refs returns how many rules and map elements jump or go to chain.
func (t *fakeTable) refs(chain string) int {
	n := 0
	for _, c := range t.ruleRefs[chain] {
		n += c
	}
	for _, c := range t.elemRefs[chain] {
		n += c
	}
	return n
}

// fakeTx applies ops to the table in place, logging how to undo each
// change, so a failed Tx costs what it changed, not the table's size.
type fakeTx struct {
	t    *fakeTable
	undo []func()
	// dirty are the chains that got rules, or became a map element's
	// target: what the commit check walks from.
	dirty map[string]bool
	// delSets are the sets deleted (perhaps re-created) by this tx,
	// whose elements are gone.
	delSets map[string]bool
}

func (x *fakeTx) rollback() {
	for i := len(x.undo) - 1; i >= 0; i-- {
		x.undo[i]()
	}
}

// put sets m[k] to v, or deletes k when del is set, and records how to
// undo it.
func put[K comparable, V any](x *fakeTx, m map[K]V, k K, v V, del bool) {
	old, ok := m[k]
	x.undo = append(x.undo, func() {
		if ok {
			m[k] = old
		} else {
			delete(m, k)
		}
	})
	if del {
		delete(m, k)
	} else {
		m[k] = v
	}
}

func (x *fakeTx) setChain(name string, c *fakeChain) { put(x, x.t.chains, name, c, c == nil) }

func (x *fakeTx) setRules(c *fakeChain, rules []nft.Rule) {
	old := c.rules
	x.undo = append(x.undo, func() { c.rules = old })
	c.rules = rules
}

func (x *fakeTx) setMap(name string, m *fakeMap) { put(x, x.t.maps, name, m, m == nil) }

func (x *fakeTx) setElem(m *fakeMap, k nft.MapKey, v fakeElem, add bool) { put(x, m.elems, k, v, !add) }

func (x *fakeTx) setSet(name string, s *nft.AddrSet) { put(x, x.t.sets, name, s, s == nil) }

func (x *fakeTx) bump(m map[string]int, k string, d int) {
	old := m[k]
	x.undo = append(x.undo, func() {
		if old == 0 {
			delete(m, k)
		} else {
			m[k] = old
		}
	})
	if old+d == 0 {
		delete(m, k)
	} else {
		m[k] = old + d
	}
}

func (x *fakeTx) bump2(m map[string]map[string]int, k1, k2 string, d int) {
	inner := m[k1]
	if inner == nil {
		inner = map[string]int{}
		m[k1] = inner
		x.undo = append(x.undo, func() { delete(m, k1) })
	}
	x.bump(inner, k2, d)
	if len(inner) == 0 {
		delete(m, k1)
		x.undo = append(x.undo, func() { m[k1] = inner })
	}
}

// Apply applies tx atomically. An empty Tx changes nothing (and, like
// Netlink's, does not create the table).
func (f *Fake) Apply(tx *nft.Tx) error {
	if tx == nil || len(tx.Ops) == 0 {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	x := &fakeTx{t: f.table, dirty: map[string]bool{}, delSets: map[string]bool{}}
	for i, op := range tx.Ops {
		if err := x.apply(op); err != nil {
			x.rollback()
			return fmt.Errorf("apply tx: op %d (%s): %w", i, op.String(), err)
		}
	}
	if x.t != nil {
		if err := x.t.validate(x.dirty); err != nil {
			x.rollback()
			return fmt.Errorf("apply tx: %w", err)
		}
	}
	f.table = x.t
	f.txs++
	f.ops += len(tx.Ops)
	f.last = slices.Clone(tx.Ops)
	for name := range f.affinity {
		if f.table == nil || f.table.sets[name] == nil || x.delSets[name] {
			delete(f.affinity, name)
		}
	}
	return nil
}

// Ops returns how many ops the successful Applies held in all.
func (f *Fake) Ops() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ops
}

// Txs returns how many non-empty Txs were applied successfully.
func (f *Fake) Txs() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.txs
}

// Last returns the ops of the last successful non-empty Apply.
func (f *Fake) Last() []nft.Op {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.last)
}

// Counts returns how many chains, rules and map elements the table
// holds.
func (f *Fake) Counts() (chains, rules, elements int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.table == nil {
		return 0, 0, 0
	}
	for _, c := range f.table.chains {
		rules += len(c.rules)
	}
	for _, m := range f.table.maps {
		elements += len(m.elems)
	}
	return len(f.table.chains), rules, elements
}

// List returns the names of the table's chains, maps and sets, sorted.
func (f *Fake) List() (nft.Contents, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var c nft.Contents
	if f.table == nil {
		return c, nil
	}
	c.Chains = slices.Sorted(maps.Keys(f.table.chains))
	c.Maps = slices.Sorted(maps.Keys(f.table.maps))
	c.Sets = slices.Sorted(maps.Keys(f.table.sets))
	return c, nil
}

func (x *fakeTx) apply(op nft.Op) error {
	if op.Kind == nft.OpDelTable {
		if x.t != nil {
			for name := range x.t.sets {
				x.delSets[name] = true
			}
		}
		// The old table is left as it was (but for earlier ops, which
		// the undo log covers); a later op starts a new one.
		x.t = nil
		x.dirty = map[string]bool{}
		return nil
	}
	if x.t == nil {
		x.t = newFakeTable()
	}
	t := x.t
	switch op.Kind {
	case nft.OpAddChain:
		return x.addChain(op.Chain)
	case nft.OpFlushChain:
		c := t.chains[op.Chain.Name]
		if c == nil {
			return fmt.Errorf("no such chain: %w", unix.ENOENT)
		}
		for _, r := range c.rules {
			x.refRule(op.Chain.Name, r, -1)
		}
		x.setRules(c, nil)
	case nft.OpDelChain:
		c := t.chains[op.Chain.Name]
		if c == nil {
			return fmt.Errorf("no such chain: %w", unix.ENOENT)
		}
		if len(c.rules) > 0 {
			return fmt.Errorf("chain has %d rules, flush it first: %w", len(c.rules), unix.EBUSY)
		}
		if n := t.refs(op.Chain.Name); n > 0 {
			return fmt.Errorf("chain is the target of %d rules or map elements: %w", n, unix.EBUSY)
		}
		x.setChain(op.Chain.Name, nil)
	case nft.OpAddRule:
		c := t.chains[op.Chain.Name]
		if c == nil {
			return fmt.Errorf("no such chain: %w", unix.ENOENT)
		}
		r, err := t.checkRule(op.Rule)
		if err != nil {
			return err
		}
		// Appending in place is safe: no other slice shares the array,
		// and undoing restores the shorter header.
		x.setRules(c, append(c.rules, r))
		x.refRule(op.Chain.Name, r, 1)
		x.dirty[op.Chain.Name] = true
	case nft.OpAddMap:
		if err := nft.CheckName("map", op.Map.Name); err != nil {
			return err
		}
		if err := checkKeyType(op.Map.Key); err != nil {
			return err
		}
		if t.sets[op.Map.Name] != nil {
			return fmt.Errorf("a set has that name: %w", unix.EEXIST)
		}
		if m := t.maps[op.Map.Name]; m != nil {
			if m.key != op.Map.Key || m.set != op.Map.Set || m.v6 != op.Map.V6 {
				return fmt.Errorf("map exists with key %s: %w", m.key, unix.EEXIST)
			}
			return nil
		}
		x.setMap(op.Map.Name, &fakeMap{key: op.Map.Key, set: op.Map.Set, v6: op.Map.V6, elems: map[nft.MapKey]fakeElem{}})
	case nft.OpDelMap:
		m := t.maps[op.Map.Name]
		if m == nil {
			return fmt.Errorf("no such map: %w", unix.ENOENT)
		}
		n := 0
		for _, c := range t.mapUsers[op.Map.Name] {
			n += c
		}
		if n > 0 {
			return fmt.Errorf("map is used by %d rules: %w", n, unix.EBUSY)
		}
		for _, v := range m.elems {
			if v.Chain != "" {
				x.bump2(t.elemRefs, v.Chain, op.Map.Name, -1)
			}
		}
		x.setMap(op.Map.Name, nil)
	case nft.OpAddElem:
		m := t.maps[op.Map.Name]
		if m == nil {
			return fmt.Errorf("no such map: %w", unix.ENOENT)
		}
		k, err := checkElemKey(m.key, op.Map.Key, op.Key)
		if err != nil {
			return err
		}
		switch {
		case m.set || m.key.Endpoint():
			if op.Verdict != (nft.Verdict{}) {
				return fmt.Errorf("element of %s with verdict %s: %w", op.Map.Name, op.Verdict, unix.EINVAL)
			}
		default:
			if err := t.checkVerdict(op.Verdict); err != nil {
				return err
			}
		}
		if err := m.def().CheckData(op.Data); err != nil {
			return fmt.Errorf("element %s of %s: %w", k.Format(m.key), op.Map.Name, err)
		}
		el := fakeElem{Verdict: op.Verdict, data: op.Data}
		if old, ok := m.elems[k]; ok {
			if old != el {
				return fmt.Errorf("element exists with %s: %w", old.format(), unix.EEXIST)
			}
			return nil
		}
		x.setElem(m, k, el, true)
		if c := op.Verdict.Chain; c != "" {
			x.bump2(t.elemRefs, c, op.Map.Name, 1)
			x.dirty[c] = true
		}
	case nft.OpDelElem:
		m := t.maps[op.Map.Name]
		if m == nil {
			return fmt.Errorf("no such map: %w", unix.ENOENT)
		}
		k, err := checkElemKey(m.key, op.Map.Key, op.Key)
		if err != nil {
			return err
		}
		v, ok := m.elems[k]
		if !ok {
			return fmt.Errorf("no such element: %w", unix.ENOENT)
		}
		x.setElem(m, k, fakeElem{}, false)
		if v.Chain != "" {
			x.bump2(t.elemRefs, v.Chain, op.Map.Name, -1)
		}
	case nft.OpAddSet:
		if err := nft.CheckName("set", op.Set.Name); err != nil {
			return err
		}
		if op.Set.Timeout < 0 {
			return fmt.Errorf("timeout %s is negative: %w", op.Set.Timeout, unix.EINVAL)
		}
		if t.maps[op.Set.Name] != nil {
			return fmt.Errorf("a map has that name: %w", unix.EEXIST)
		}
		if s := t.sets[op.Set.Name]; s != nil {
			if s.V6 != op.Set.V6 {
				return fmt.Errorf("set exists with type %s: %w", nft.AddrType(s.V6), unix.EEXIST)
			}
			if s.Timeout.Truncate(time.Millisecond) != op.Set.Timeout.Truncate(time.Millisecond) {
				return fmt.Errorf("set exists with timeout %s (older kernels would keep it): delete and re-create it: %w", s.Timeout, unix.EEXIST)
			}
			return nil
		}
		s := op.Set
		x.setSet(s.Name, &s)
	case nft.OpDelSet:
		if t.sets[op.Set.Name] == nil {
			return fmt.Errorf("no such set: %w", unix.ENOENT)
		}
		if n := t.setRefs[op.Set.Name]; n > 0 {
			return fmt.Errorf("set is used by %d rules: %w", n, unix.EBUSY)
		}
		x.setSet(op.Set.Name, nil)
		x.delSets[op.Set.Name] = true
	default:
		return fmt.Errorf("unknown op kind %d: %w", int(op.Kind), unix.EINVAL)
	}
	return nil
}

func (x *fakeTx) addChain(c nft.Chain) error {
	if err := nft.CheckName("chain", c.Name); err != nil {
		return err
	}
	if c.Base != nil {
		if err := checkBase(*c.Base); err != nil {
			return err
		}
	}
	old := x.t.chains[c.Name]
	if old == nil {
		var base *nft.Base
		if c.Base != nil {
			b := *c.Base
			base = &b
		}
		x.setChain(c.Name, &fakeChain{base: base})
		return nil
	}
	switch {
	case c.Base == nil:
		return nil // the kernel leaves an existing chain alone
	case old.base == nil:
		return fmt.Errorf("chain exists as a regular chain: %w", unix.EEXIST)
	case *old.base != *c.Base:
		return fmt.Errorf("chain exists as %s: %w", baseLine(*old.base), unix.EOPNOTSUPP)
	}
	return nil
}

func checkBase(b nft.Base) error {
	switch b.Hook {
	case nft.HookPrerouting, nft.HookInput, nft.HookOutput, nft.HookPostrouting:
	case nft.HookForward:
		if b.Type == nft.ChainTypeNAT {
			return fmt.Errorf("nat chains cannot hook forward: %w", unix.EOPNOTSUPP)
		}
	default:
		return fmt.Errorf("unknown hook %q: %w", b.Hook, unix.EOPNOTSUPP)
	}
	if b.Type != nft.ChainTypeNAT && b.Type != nft.ChainTypeFilter {
		return fmt.Errorf("unknown chain type %q: %w", b.Type, unix.ENOENT)
	}
	return nil
}

func checkKeyType(k nft.KeyType) error {
	switch k {
	case nft.KeyAddr4ProtoPort, nft.KeyAddr6ProtoPort, nft.KeyProtoPort, nft.KeyAddr4Pair, nft.KeyAddr6Pair,
		nft.KeyAddr4ProtoPortIndex, nft.KeyAddr6ProtoPortIndex, nft.KeyProtoPortIndex:
		return nil
	}
	return fmt.Errorf("unknown key type %q: %w", k, unix.EINVAL)
}

// format prints the element's value as nft does.
func (e fakeElem) format() string {
	if e.data.IsValid() {
		return e.data.Addr().String() + " . " + fmt.Sprint(e.data.Port())
	}
	return e.Verdict.String()
}

// checkElemKey checks an element's key against the map's key type and returns
// it with the protocol in upper case.
func checkElemKey(mapKey, opKey nft.KeyType, k nft.MapKey) (nft.MapKey, error) {
	if opKey != mapKey {
		return k, fmt.Errorf("op says key type %q, map has %q: %w", opKey, mapKey, unix.EINVAL)
	}
	if mapKey.Pair() {
		v6 := mapKey == nft.KeyAddr6Pair
		if !k.Addr.IsValid() || !k.Addr2.IsValid() || k.Addr.Is6() != v6 || k.Addr2.Is6() != v6 || k.Addr.Is4In6() || k.Addr2.Is4In6() {
			return k, fmt.Errorf("key %s: map %s needs two %s addresses: %w", k, mapKey, nft.AddrType(v6), unix.EINVAL)
		}
		if k.Protocol != "" || k.Port != 0 {
			return k, fmt.Errorf("key %s: map %s takes no protocol or port: %w", k, mapKey, unix.EINVAL)
		}
		return k, nil
	}
	if k.Addr2.IsValid() {
		return k, fmt.Errorf("key %s: map %s takes one address: %w", k, mapKey, unix.EINVAL)
	}
	if k.Index != 0 && !mapKey.Endpoint() {
		return k, fmt.Errorf("key %s: map %s takes no index: %w", k, mapKey, unix.EINVAL)
	}
	k.Protocol = strings.ToUpper(k.Protocol)
	if _, ok := nft.ProtocolNumber(k.Protocol); !ok {
		return k, fmt.Errorf("protocol %q: want TCP, UDP or SCTP: %w", k.Protocol, unix.EINVAL)
	}
	switch mapKey {
	case nft.KeyAddr4ProtoPort, nft.KeyAddr4ProtoPortIndex:
		if !k.Addr.Is4() {
			return k, fmt.Errorf("key %s: map %s needs an IPv4 address: %w", k, mapKey, unix.EINVAL)
		}
	case nft.KeyAddr6ProtoPort, nft.KeyAddr6ProtoPortIndex:
		if !k.Addr.Is6() || k.Addr.Is4In6() {
			return k, fmt.Errorf("key %s: map %s needs an IPv6 address: %w", k, mapKey, unix.EINVAL)
		}
	case nft.KeyProtoPort, nft.KeyProtoPortIndex:
		if k.Addr.IsValid() {
			return k, fmt.Errorf("key %s: map %s takes no address: %w", k, mapKey, unix.EINVAL)
		}
	}
	return k, nil
}

// def is m as an nft.Map (without its name).
func (m *fakeMap) def() nft.Map { return nft.Map{Key: m.key, Set: m.set, V6: m.v6} }

func (t *fakeTable) checkVerdict(v nft.Verdict) error {
	switch v.Kind {
	case nft.VerdictAccept, nft.VerdictDrop, nft.VerdictReturn:
		if v.Chain != "" {
			return fmt.Errorf("verdict %s takes no chain: %w", v.Kind, unix.EINVAL)
		}
		return nil
	case nft.VerdictJump, nft.VerdictGoto:
		return t.checkTarget(v.Chain)
	}
	return fmt.Errorf("unknown verdict %q: %w", v.Kind, unix.EINVAL)
}

// checkTarget checks a jump or goto target.
func (t *fakeTable) checkTarget(name string) error {
	c := t.chains[name]
	if c == nil {
		return fmt.Errorf("target chain %q: no such chain: %w", name, unix.ENOENT)
	}
	if c.base != nil {
		return fmt.Errorf("target chain %q is a base chain: %w", name, unix.EOPNOTSUPP)
	}
	return nil
}

// checkRule checks a rule's statements against the table and returns a
// copy the caller cannot change under us.
func (t *fakeTable) checkRule(r nft.Rule) (nft.Rule, error) {
	out := nft.Rule{Comment: r.Comment, Stmts: make([]nft.Stmt, 0, len(r.Stmts))}
	for i, s := range r.Stmts {
		if i > 0 && r.Stmts[i-1].Info().Terminal {
			return r, fmt.Errorf("statement %d (%s) follows a terminal statement and would never run: %w", i, stmtString(s), unix.EINVAL)
		}
		k, ok := stmtKindOf(s)
		if !ok {
			return r, fmt.Errorf("statement %d (%s): unsupported statement type %T: %w", i, stmtString(s), s, unix.EOPNOTSUPP)
		}
		if err := k.check(t, s); err != nil {
			return r, fmt.Errorf("statement %d (%s): %w", i, stmtString(s), err)
		}
		out.Stmts = append(out.Stmts, s)
	}
	return out, nil
}

// stmtString prints s, or nil.
func stmtString(s nft.Stmt) string {
	if s == nil {
		return "nil"
	}
	return s.String()
}

// refRule counts (d = 1) or uncounts (d = -1) what a rule of chain
// refers to.
func (x *fakeTx) refRule(chain string, r nft.Rule, d int) {
	t := x.t
	for _, s := range r.Stmts {
		info := s.Info()
		if info.Chain != "" {
			x.bump2(t.ruleRefs, info.Chain, chain, d)
		}
		if info.Map != "" {
			x.bump2(t.mapUsers, info.Map, chain, d)
		}
		if info.Set != "" {
			x.bump(t.setRefs, info.Set, d)
		}
	}
}

// maxJumpDepth is NFT_JUMP_STACK_SIZE: the kernel refuses a table where a
// base chain reaches a chain through more jumps or gotos.
const maxJumpDepth = 16

// validate does what the kernel does at commit, for what the Tx changed:
// from the dirty chains (that got rules, or became a map element's
// target), reached from some base chains, it walks every chain reachable
// by jump, goto, vmap and numgen, refusing loops, too deep nesting, and
// statements the base chain's hook or type does not allow. A failure is
// looked for again in sorted order, so the error does not depend on map
// iteration.
func (t *fakeTable) validate(dirty map[string]bool) error {
	if len(dirty) == 0 {
		return nil
	}
	if err := t.newWalker(false).check(dirty); err != nil {
		return t.newWalker(true).check(dirty)
	}
	return nil
}

type walkCtx struct {
	typ  nft.ChainType
	hook nft.Hook
}

type walkKey struct {
	chain string
	ctx   walkCtx
}

type commitWalker struct {
	t      *fakeTable
	sorted bool
	height map[walkKey]int            // -1 while being walked
	reach  map[string]map[walkCtx]int // chain -> base contexts reaching it -> longest distance
}

func (t *fakeTable) newWalker(sorted bool) *commitWalker {
	return &commitWalker{t: t, sorted: sorted, height: map[walkKey]int{}, reach: map[string]map[walkCtx]int{}}
}

func (w *commitWalker) keys(m map[string]bool) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	if w.sorted {
		slices.Sort(ks)
	}
	return ks
}

func (w *commitWalker) check(dirty map[string]bool) error {
	for _, name := range w.keys(dirty) {
		if w.t.chains[name] == nil {
			continue // deleted later in the tx
		}
		reach := w.reachOf(name, map[string]bool{})
		ctxs := slices.Collect(maps.Keys(reach))
		if w.sorted {
			slices.SortFunc(ctxs, func(a, b walkCtx) int {
				return cmp.Or(strings.Compare(string(a.hook), string(b.hook)), strings.Compare(string(a.typ), string(b.typ)))
			})
		}
		for _, ctx := range ctxs {
			h, err := w.walk(name, ctx)
			if err != nil {
				return fmt.Errorf("from a %s %s chain: %w", ctx.typ, ctx.hook, err)
			}
			if d := reach[ctx] + h; d > maxJumpDepth {
				return fmt.Errorf("from a %s %s chain: chain %s is %d jumps deep and has %d more below, the kernel allows %d: %w",
					ctx.typ, ctx.hook, name, reach[ctx], h, maxJumpDepth, unix.EMLINK)
			}
		}
	}
	return nil
}

// reachOf returns the base chain contexts that reach chain, with the
// longest distance from such a base chain. Loops (which walk refuses
// when a base chain reaches them) are cut.
func (w *commitWalker) reachOf(chain string, visiting map[string]bool) map[walkCtx]int {
	if r, ok := w.reach[chain]; ok {
		return r
	}
	if visiting[chain] {
		return nil
	}
	visiting[chain] = true
	defer delete(visiting, chain)
	r := map[walkCtx]int{}
	merge := func(from map[walkCtx]int) {
		for ctx, d := range from {
			if old, ok := r[ctx]; !ok || d+1 > old {
				r[ctx] = d + 1
			}
		}
	}
	if b := w.t.chains[chain].base; b != nil {
		r[walkCtx{b.Type, b.Hook}] = 0
	}
	for p := range w.t.ruleRefs[chain] {
		merge(w.reachOf(p, visiting))
	}
	for m := range w.t.elemRefs[chain] {
		for u := range w.t.mapUsers[m] {
			merge(w.reachOf(u, visiting))
		}
	}
	w.reach[chain] = r
	return r
}

// walk returns the jump depth below chain, reached from a base chain of
// ctx.
func (w *commitWalker) walk(chain string, ctx walkCtx) (int, error) {
	k := walkKey{chain, ctx}
	if d, ok := w.height[k]; ok {
		if d < 0 {
			// The kernel finds a loop as too deep a jump stack.
			return 0, fmt.Errorf("chain %s: loop: %w", chain, unix.EMLINK)
		}
		return d, nil
	}
	w.height[k] = -1
	depth := 0
	next := func(target string) error {
		d, err := w.walk(target, ctx)
		if err != nil {
			return err
		}
		depth = max(depth, d+1)
		return nil
	}
	for _, r := range w.t.chains[chain].rules {
		for _, s := range r.Stmts {
			info := s.Info()
			if err := info.AllowedIn(ctx.typ, ctx.hook); err != nil {
				return 0, fmt.Errorf("chain %s: %s: %w", chain, s, err)
			}
			if info.Chain != "" {
				if err := next(info.Chain); err != nil {
					return 0, err
				}
			}
			vmap := info.Map
			if vmap == "" {
				continue
			}
			elems := w.t.maps[vmap].elems
			if w.sorted {
				for _, key := range slices.SortedFunc(maps.Keys(elems), compareMapKeys) {
					if c := elems[key].Chain; c != "" {
						if err := next(c); err != nil {
							return 0, err
						}
					}
				}
				continue
			}
			for _, v := range elems {
				if v.Chain != "" {
					if err := next(v.Chain); err != nil {
						return 0, err
					}
				}
			}
		}
	}
	if depth > maxJumpDepth {
		return 0, fmt.Errorf("chain %s: %d nested jumps below it, the kernel allows %d: %w", chain, depth, maxJumpDepth, unix.EMLINK)
	}
	w.height[k] = depth
	return depth, nil
}

func compareMapKeys(a, b nft.MapKey) int {
	return cmp.Or(a.Addr.Compare(b.Addr), a.Addr2.Compare(b.Addr2), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Index, b.Index))
}

// Dump returns the table as `nft list table inet outpost` prints it, with
// sets and maps (sorted by name) before chains (sorted by name) and map
// elements sorted, one a line; "" when there is no table. Rules print as nft prints
// them back from the kernel: `meta l4proto tcp th dport 80` as
// `tcp dport 80`, and `meta nfproto` left out where a later address match
// of the same family implies it. Base chain priorities stay numeric.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.table
	if t == nil {
		return ""
	}
	type block struct{ name, text string }
	var objs []block
	for name, s := range t.sets {
		var b strings.Builder
		fmt.Fprintf(&b, "\tset %s {\n\t\ttype %s\n\t\tsize %d\n\t\tflags dynamic,timeout\n", name, nft.AddrType(s.V6), nft.AffinitySetSize)
		if ts := nftDuration(s.Timeout); ts != "" {
			fmt.Fprintf(&b, "\t\ttimeout %s\n", ts)
		}
		b.WriteString("\t}\n")
		objs = append(objs, block{name, b.String()})
	}
	for name, m := range t.maps {
		var b strings.Builder
		if m.set {
			fmt.Fprintf(&b, "\tset %s {\n\t\ttype %s\n", name, m.key)
		} else {
			fmt.Fprintf(&b, "\tmap %s {\n\t\ttype %s : %s\n", name, m.key, m.def().DataType())
		}
		if len(m.elems) > 0 {
			elems := make([]string, 0, len(m.elems))
			for k, v := range m.elems {
				if m.set {
					elems = append(elems, k.Format(m.key))
				} else {
					elems = append(elems, k.Format(m.key)+" : "+v.format())
				}
			}
			b.WriteString(formatElements(elems))
		}
		b.WriteString("\t}\n")
		objs = append(objs, block{name, b.String()})
	}
	slices.SortFunc(objs, func(a, b block) int { return strings.Compare(a.name, b.name) })
	var blocks []string
	for _, o := range objs {
		blocks = append(blocks, o.text)
	}
	for _, name := range slices.Sorted(maps.Keys(t.chains)) {
		c := t.chains[name]
		var b strings.Builder
		fmt.Fprintf(&b, "\tchain %s {\n", name)
		if c.base != nil {
			fmt.Fprintf(&b, "\t\t%s\n", baseLine(*c.base))
		}
		for _, r := range c.rules {
			fmt.Fprintf(&b, "\t\t%s\n", nftRule(r))
		}
		b.WriteString("\t}\n")
		blocks = append(blocks, b.String())
	}
	return "table inet " + nft.TableName + " {\n" + strings.Join(blocks, "\n") + "}\n"
}

// formatElements prints map elements as nft does, one a line, sorted.
func formatElements(elems []string) string {
	slices.Sort(elems)
	return "\t\telements = { " + strings.Join(elems, ",\n\t\t\t     ") + " }\n"
}

// baseLine is a base chain's first line as nft prints it, except that the
// priority stays a number.
func baseLine(b nft.Base) string {
	return fmt.Sprintf("type %s hook %s priority %d; policy accept;", b.Type, b.Hook, b.Priority)
}

// nftDuration prints d as nft prints timeouts: 3h, 1h30m, 10s, 250ms.
func nftDuration(d time.Duration) string {
	ms := d.Milliseconds()
	var b strings.Builder
	for _, u := range []struct {
		ms   int64
		unit string
	}{{86400000, "d"}, {3600000, "h"}, {60000, "m"}, {1000, "s"}, {1, "ms"}} {
		if n := ms / u.ms; n > 0 {
			fmt.Fprintf(&b, "%d%s", n, u.unit)
			ms -= n * u.ms
		}
	}
	return b.String()
}

// nftRule prints a rule as nft lists it from the kernel.
func nftRule(r nft.Rule) string {
	parts := make([]string, 0, len(r.Stmts)+1)
	for i, s := range r.Stmts {
		if k, ok := stmtKindOf(s); ok && k.list != nil {
			if text, ok := k.list(s, r.Stmts[i+1:]); ok {
				parts = append(parts, text)
			}
			continue
		}
		parts = append(parts, s.String())
	}
	if r.Comment != "" {
		parts = append(parts, fmt.Sprintf("comment %q", r.Comment))
	}
	return strings.Join(parts, " ")
}
