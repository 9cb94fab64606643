package nfttest

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/outpost-edge/outpost/netproxy/nft"
)

// This file is the Fake's side of each statement of netproxy/nft's
// stmt.go, one entry a statement type: what the kernel checks when a rule
// uses it (against the table: the maps, sets and chains it names), what
// it does to a traced packet, and, where nft lists it otherwise than
// String, how. What a statement is (terminal, the family it loads, what
// it names, where it may run) is nft.StmtInfo, in production beside its
// encoding; the Fake and the tracer read it there.

// stmtKind is what the Fake knows of one statement type.
type stmtKind struct {
	// check checks the statement against the table, with the kernel's
	// errno.
	check func(t *fakeTable, s nft.Stmt) error
	// eval applies the statement to a traced packet.
	eval func(tr *tracer, st *traceState, s nft.Stmt) (ruleResult, error)
	// list, when set, prints the statement as nft lists it back from
	// the kernel, given the statements after it; false leaves it out.
	list func(s nft.Stmt, rest []nft.Stmt) (string, bool)
}

// kind makes the stmtKind of statement type S from funcs that take an S;
// a nil check accepts every S.
func kind[S nft.Stmt](check func(*fakeTable, S) error, eval func(*tracer, *traceState, S) (ruleResult, error)) stmtKind {
	k := stmtKind{
		check: func(*fakeTable, nft.Stmt) error { return nil },
		eval:  func(tr *tracer, st *traceState, s nft.Stmt) (ruleResult, error) { return eval(tr, st, s.(S)) },
	}
	if check != nil {
		k.check = func(t *fakeTable, s nft.Stmt) error { return check(t, s.(S)) }
	}
	return k
}

// withList adds how nft lists statements of type S.
func withList[S nft.Stmt](k stmtKind, list func(s S, rest []nft.Stmt) (string, bool)) stmtKind {
	k.list = func(s nft.Stmt, rest []nft.Stmt) (string, bool) { return list(s.(S), rest) }
	return k
}

// stmtKindOf returns the entry of s's type; false for a type the Fake
// does not know (a pointer to a statement, or nil).
func stmtKindOf(s nft.Stmt) (stmtKind, bool) {
	k, ok := stmtKinds[reflect.TypeOf(s)]
	return k, ok
}

// Results of a statement for a traced packet: it matched (or acted) and
// the rule goes on, or it did not match and the next rule runs.
var (
	goOn    = ruleResult{next: true}
	noMatch = ruleResult{}
	accept  = ruleResult{verdict: &nft.Verdict{Kind: nft.VerdictAccept}}
)

// matchIf is goOn when ok, else noMatch.
func matchIf(ok bool) ruleResult {
	if ok {
		return goOn
	}
	return noMatch
}

var stmtKinds = map[reflect.Type]stmtKind{
	reflect.TypeFor[nft.MatchFamily](): withList(kind(nil,
		func(_ *tracer, st *traceState, s nft.MatchFamily) (ruleResult, error) {
			return matchIf(st.v6() == s.V6), nil
		}),
		func(s nft.MatchFamily, rest []nft.Stmt) (string, bool) {
			// nft leaves out the dependency of a later address load.
			return s.String(), !loadsAddr(rest, s.V6)
		}),

	reflect.TypeFor[nft.MatchAddr](): kind(
		func(_ *fakeTable, s nft.MatchAddr) error {
			if !s.Prefix.IsValid() {
				return fmt.Errorf("invalid prefix: %w", unix.EINVAL)
			}
			return nil
		},
		func(_ *tracer, st *traceState, s nft.MatchAddr) (ruleResult, error) {
			a := st.src
			if s.Dst {
				a = st.dst
			}
			return matchIf(s.Prefix.Addr().Is6() == st.v6() && s.Prefix.Contains(a) != s.Not), nil
		}),

	reflect.TypeFor[nft.MatchProtoPort](): withList(kind(
		func(_ *fakeTable, s nft.MatchProtoPort) error {
			if _, ok := nft.ProtocolNumber(strings.ToUpper(s.Protocol)); !ok {
				return fmt.Errorf("protocol %q: want TCP, UDP or SCTP: %w", s.Protocol, unix.EINVAL)
			}
			return nil
		},
		func(_ *tracer, st *traceState, s nft.MatchProtoPort) (ruleResult, error) {
			return matchIf(strings.EqualFold(s.Protocol, st.proto) && (s.Port == 0 || s.Port == st.port)), nil
		}),
		func(s nft.MatchProtoPort, _ []nft.Stmt) (string, bool) {
			if s.Port != 0 {
				return fmt.Sprintf("%s dport %d", strings.ToLower(s.Protocol), s.Port), true
			}
			return "meta l4proto " + strings.ToLower(s.Protocol), true
		}),

	reflect.TypeFor[nft.MatchAddrType](): kind(nil,
		func(tr *tracer, st *traceState, s nft.MatchAddrType) (ruleResult, error) {
			a := st.src
			if s.Dst {
				a = st.dst
			}
			return matchIf(tr.local(a) != s.Not), nil
		}),

	reflect.TypeFor[nft.MatchMark](): kind(nil,
		func(_ *tracer, st *traceState, s nft.MatchMark) (ruleResult, error) {
			return matchIf((st.mark&s.Bit != 0) == s.Set), nil
		}),

	reflect.TypeFor[nft.SetMark](): kind(nil,
		func(_ *tracer, st *traceState, s nft.SetMark) (ruleResult, error) {
			if s.Xor {
				st.mark ^= s.Bit
			} else {
				st.mark |= s.Bit
			}
			return goOn, nil
		}),

	reflect.TypeFor[nft.MatchDNATed](): kind(nil,
		func(_ *tracer, st *traceState, _ nft.MatchDNATed) (ruleResult, error) {
			return matchIf(st.dnated), nil
		}),

	reflect.TypeFor[nft.MapLookup](): kind(
		func(t *fakeTable, s nft.MapLookup) error {
			if err := checkKeyType(s.Key); err != nil {
				return err
			}
			m := t.maps[s.Map]
			if m == nil {
				return fmt.Errorf("map %q: no such map: %w", s.Map, unix.ENOENT)
			}
			if m.key != s.Key {
				return fmt.Errorf("map %q has key %s, lookup loads %s: %w", s.Map, m.key, s.Key, unix.EINVAL)
			}
			if m.set || m.key.Endpoint() {
				return fmt.Errorf("map %q does not map to verdicts: %w", s.Map, unix.EINVAL)
			}
			return nil
		},
		func(tr *tracer, st *traceState, s nft.MapLookup) (ruleResult, error) {
			m := tr.t.maps[s.Map]
			if m == nil {
				return noMatch, fmt.Errorf("map %s: no such map", s.Map)
			}
			k := nft.MapKey{Protocol: st.proto, Port: st.port}
			switch m.key {
			case nft.KeyAddr4ProtoPort, nft.KeyAddr6ProtoPort:
				if st.v6() != (m.key == nft.KeyAddr6ProtoPort) {
					return noMatch, nil
				}
				k.Addr = st.dst
			case nft.KeyAddr4Pair, nft.KeyAddr6Pair:
				if st.v6() != (m.key == nft.KeyAddr6Pair) {
					return noMatch, nil
				}
				k = nft.MapKey{Addr: st.src, Addr2: st.dst}
			}
			v, ok := m.elems[k]
			if !ok {
				return noMatch, nil
			}
			return ruleResult{verdict: &v.Verdict}, nil
		}),

	reflect.TypeFor[nft.MatchRandom](): kind(
		func(_ *fakeTable, s nft.MatchRandom) error {
			if s.Mod == 0 {
				return fmt.Errorf("numgen modulus 0: %w", unix.ERANGE)
			}
			return nil
		},
		func(tr *tracer, st *traceState, s nft.MatchRandom) (ruleResult, error) {
			if s.Mod > 1 {
				// Both ways happen: this copy goes on with the next
				// rule, as if numgen had not drawn 0.
				miss := st.clone()
				miss.out.Share *= float64(s.Mod-1) / float64(s.Mod)
				tr.forks = append(tr.forks, miss)
				st.out.Share /= float64(s.Mod)
			}
			return goOn, nil
		}),

	reflect.TypeFor[nft.MatchSet](): kind(
		func(t *fakeTable, s nft.MatchSet) error {
			m := t.maps[s.Set]
			if m == nil {
				return fmt.Errorf("set %q: no such set: %w", s.Set, unix.ENOENT)
			}
			if !m.set {
				return fmt.Errorf("%q is a map, not a set: %w", s.Set, unix.EINVAL)
			}
			if _, addrKey := s.Key.AddrProtoPort(); m.key != s.Key || !s.Key.Pair() && s.Key != nft.KeyProtoPort && (!addrKey || s.Key.Endpoint()) {
				return fmt.Errorf("set %q has key %s, lookup loads %s: %w", s.Set, m.key, s.Key, unix.EINVAL)
			}
			return nil
		},
		func(tr *tracer, st *traceState, s nft.MatchSet) (ruleResult, error) {
			m := tr.t.maps[s.Set]
			if m == nil {
				return noMatch, fmt.Errorf("set %s: no such set", s.Set)
			}
			if s.Key == nft.KeyProtoPort {
				_, ok := m.elems[nft.MapKey{Protocol: st.proto, Port: st.port}]
				return matchIf(ok), nil
			}
			k := nft.MapKey{Addr: st.src, Addr2: st.dst}
			v6, ok := s.Key.AddrProtoPort()
			if ok {
				k = nft.MapKey{Addr: st.dst, Protocol: st.proto, Port: st.port}
			} else {
				v6 = s.Key == nft.KeyAddr6Pair
			}
			if st.v6() != v6 {
				return noMatch, nil
			}
			_, ok = m.elems[k]
			return matchIf(ok), nil
		}),

	reflect.TypeFor[nft.SetLookup](): kind(
		func(t *fakeTable, s nft.SetLookup) error { return t.checkSet(s.Set, s.V6) },
		func(tr *tracer, st *traceState, s nft.SetLookup) (ruleResult, error) {
			return matchIf(s.V6 == st.v6() && tr.affinity[s.Set][st.src]), nil
		}),

	reflect.TypeFor[nft.SetUpdate](): kind(
		func(t *fakeTable, s nft.SetUpdate) error { return t.checkSet(s.Set, s.V6) },
		func(_ *tracer, st *traceState, s nft.SetUpdate) (ruleResult, error) {
			if s.V6 != st.v6() {
				return noMatch, nil
			}
			st.out.AffinityUpdates = append(st.out.AffinityUpdates, s.Set)
			return goOn, nil
		}),

	reflect.TypeFor[nft.DNAT](): kind(
		func(_ *fakeTable, s nft.DNAT) error {
			if !s.Addr.IsValid() || s.Addr.Is4In6() {
				return fmt.Errorf("address %s: want an IPv4 or IPv6 address: %w", s.Addr, unix.EINVAL)
			}
			if s.Port == 0 {
				return fmt.Errorf("port 0: %w", unix.EINVAL)
			}
			return nil
		},
		func(_ *tracer, st *traceState, s nft.DNAT) (ruleResult, error) {
			if s.Addr.Is6() != st.v6() {
				return goOn, nil // the kernel's inet nat ignores the other family
			}
			st.dnat(netip.AddrPortFrom(s.Addr, s.Port))
			return accept, nil
		}),

	reflect.TypeFor[nft.DNATMap](): kind(
		func(t *fakeTable, s nft.DNATMap) error {
			want := nft.Map{Key: nft.KeyAddr4ProtoPortIndex}
			if s.V6 {
				want.Key = nft.KeyAddr6ProtoPortIndex
			}
			return t.checkDNATMap(s.Map, s.Mod, want)
		},
		func(tr *tracer, st *traceState, s nft.DNATMap) (ruleResult, error) {
			// The key's load needs the family.
			return tr.dnatMap(st, s.Map, s.Mod, s.V6, true)
		}),

	reflect.TypeFor[nft.DNATPortMap](): kind(
		func(t *fakeTable, s nft.DNATPortMap) error {
			return t.checkDNATMap(s.Map, s.Mod, nft.Map{Key: nft.KeyProtoPortIndex, V6: s.V6})
		},
		func(tr *tracer, st *traceState, s nft.DNATPortMap) (ruleResult, error) {
			// The rule matches the family first.
			return tr.dnatMap(st, s.Map, s.Mod, s.V6, false)
		}),

	reflect.TypeFor[nft.Masquerade](): kind(nil,
		func(_ *tracer, st *traceState, _ nft.Masquerade) (ruleResult, error) {
			st.out.Masquerade, st.natted = true, true
			return accept, nil
		}),

	reflect.TypeFor[nft.Reject](): kind(nil,
		func(_ *tracer, st *traceState, _ nft.Reject) (ruleResult, error) {
			st.out.Rejected = true
			return ruleResult{stop: true}, nil
		}),

	reflect.TypeFor[nft.VerdictStmt](): kind(
		func(t *fakeTable, s nft.VerdictStmt) error { return t.checkVerdict(s.Verdict) },
		func(_ *tracer, _ *traceState, s nft.VerdictStmt) (ruleResult, error) {
			return ruleResult{verdict: &s.Verdict}, nil
		}),
}

// checkSet checks that the set a statement tests or updates exists and
// holds addresses of its family.
func (t *fakeTable) checkSet(name string, v6 bool) error {
	s := t.sets[name]
	if s == nil {
		return fmt.Errorf("set %q: no such set: %w", name, unix.ENOENT)
	}
	if s.V6 != v6 {
		return fmt.Errorf("set %q holds %s: %w", name, nft.AddrType(s.V6), unix.EINVAL)
	}
	return nil
}

// loadsAddr reports whether one of stmts loads an address of the family
// (so needs `meta nfproto` before it in an inet table).
func loadsAddr(stmts []nft.Stmt, v6 bool) bool {
	fam := 4
	if v6 {
		fam = 6
	}
	for _, s := range stmts {
		if s.Info().Family == fam {
			return true
		}
	}
	return false
}

// checkDNATMap checks a DNAT through endpoint map name with numgen
// modulus mod: the map has the key (and, for a key without an address,
// the endpoint family) of want.
func (t *fakeTable) checkDNATMap(name string, mod uint32, want nft.Map) error {
	if mod == 0 {
		return fmt.Errorf("numgen modulus 0: %w", unix.ERANGE)
	}
	m := t.maps[name]
	if m == nil {
		return fmt.Errorf("map %q: no such map: %w", name, unix.ENOENT)
	}
	if m.key != want.Key || m.v6 != want.V6 {
		return fmt.Errorf("map %q has key %s (IPv6 endpoints: %v), dnat loads %s (IPv6 endpoints: %v): %w",
			name, m.key, m.v6, want.Key, want.V6, unix.EINVAL)
	}
	return nil
}

// dnatMap traces a DNAT of family v6 through endpoint map name with
// numgen modulus mod, keyed by the packet's destination address (when
// withAddr), protocol, port and draw. Each draw is followed: those the
// map has no element for go on with the next rule together, the others
// DNAT.
func (tr *tracer) dnatMap(st *traceState, name string, mod uint32, v6, withAddr bool) (ruleResult, error) {
	if v6 != st.v6() {
		return noMatch, nil
	}
	m := tr.t.maps[name]
	if m == nil {
		return noMatch, fmt.Errorf("map %s: no such map", name)
	}
	k := nft.MapKey{Protocol: st.proto, Port: st.port}
	if withAddr {
		k.Addr = st.dst
	}
	var hits []netip.AddrPort
	for i := range mod {
		k.Index = i
		if e, ok := m.elems[k]; ok {
			hits = append(hits, e.data)
		}
	}
	if len(hits) == 0 {
		return noMatch, nil
	}
	share := st.out.Share / float64(mod)
	if miss := int(mod) - len(hits); miss > 0 {
		f := st.clone()
		f.out.Share = share * float64(miss)
		tr.forks = append(tr.forks, f)
	}
	for _, d := range hits[1:] {
		f := st.clone()
		f.out.Share = share
		f.dnat(d)
		tr.verdict(f, *accept.verdict)
		tr.forks = append(tr.forks, f)
	}
	st.out.Share = share
	st.dnat(hits[0])
	return accept, nil
}
