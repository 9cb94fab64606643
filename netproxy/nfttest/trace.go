package nfttest

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/outpost-edge/outpost/netproxy/nft"
)

// Packet is a packet the tracer follows.
type Packet struct {
	Src, Dst netip.Addr
	Protocol string // TCP, UDP or SCTP
	Port     uint16 // destination port
	Output   bool   // sent by the node itself (output hook); else arriving (prerouting)
}

// Outcome is one way the packet can go (each numgen draw gives one).
type Outcome struct {
	DNAT              netip.AddrPort // zero when not DNATed
	Masquerade        bool
	Rejected, Dropped bool
	AffinityUpdates   []string // sets updated on the way
	Chains            []string // chains visited, in order
	Share             float64  // the share of such packets that go this way (numgen draws)
}

// String summarizes the outcome without the chains:
// `dnat to 10.42.0.5:8080, masquerade, update @aff`, `reject`, `drop`,
// or `accept` when nothing happened to the packet.
func (o Outcome) String() string {
	var parts []string
	if o.DNAT.IsValid() {
		parts = append(parts, "dnat to "+o.DNAT.String())
	}
	if o.Masquerade {
		parts = append(parts, "masquerade")
	}
	for _, s := range o.AffinityUpdates {
		parts = append(parts, "update @"+s)
	}
	switch {
	case o.Rejected:
		parts = append(parts, "reject")
	case o.Dropped:
		parts = append(parts, "drop")
	case len(parts) == 0:
		parts = append(parts, "accept")
	}
	return strings.Join(parts, ", ")
}

// AddSetElement puts addr in the named set, as a SetUpdate would have,
// so that SetLookup matches it in Trace. The element stays until the set
// is deleted; it does not show in Dump.
func (f *Fake) AddSetElement(set string, addr netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	addr = addr.Unmap()
	if f.table == nil || f.table.sets[set] == nil {
		return fmt.Errorf("add element %s to set %s: no such set", addr, set)
	}
	if s := f.table.sets[set]; s.V6 != addr.Is6() {
		return fmt.Errorf("add element %s to set %s: the set holds %s", addr, set, nft.AddrType(s.V6))
	}
	if f.affinity[set] == nil {
		f.affinity[set] = map[netip.Addr]bool{}
	}
	f.affinity[set][addr] = true
	return nil
}

// maxTraceSteps bounds the rules one way of a trace evaluates, and
// maxTraceOutcomes the ways.
const (
	maxTraceSteps    = 100000
	maxTraceOutcomes = 10000
)

// Trace follows p through the base chains in hook and priority order:
// prerouting (or output) nat and filter chains, then, by whether the
// (possibly DNATed) destination is local, input or forward filter chains,
// then postrouting nat. local says which addresses are the node's (for
// fib daddr/saddr type local).
//
// In detail: an arriving packet takes prerouting, then input when its
// destination is local, else forward and postrouting; a packet the node
// sends takes output and postrouting, then input when its destination is
// local. Within a hook, base chains run by priority (then name); accept
// (and the end of a base chain, whose policy is accept) moves on to the
// next one. As in the kernel, dnat and masquerade accept, and once a hook
// has NATed the packet its remaining nat chains are skipped; dnat of the
// other address family does nothing; reject and drop end the trace. The
// mark starts at zero, ct status dnat holds once the packet was DNATed,
// and both ways of each numgen match (drawn 0 or not) are followed
// separately, giving one Outcome each.
func (f *Fake) Trace(p Packet, local func(netip.Addr) bool) ([]Outcome, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p.Src, p.Dst = p.Src.Unmap(), p.Dst.Unmap()
	p.Protocol = strings.ToUpper(p.Protocol)
	if !p.Src.IsValid() || !p.Dst.IsValid() || p.Src.Is4() != p.Dst.Is4() {
		return nil, fmt.Errorf("trace %s -> %s: want two addresses of one family", p.Src, p.Dst)
	}
	if _, ok := nft.ProtocolNumber(p.Protocol); !ok {
		return nil, fmt.Errorf("trace: protocol %q: want TCP, UDP or SCTP", p.Protocol)
	}
	if local == nil {
		local = func(netip.Addr) bool { return false }
	}
	t := f.table
	if t == nil {
		t = newFakeTable()
	}
	tr := &tracer{t: t, affinity: f.affinity, local: local, bases: map[nft.Hook][]string{}}
	for name, c := range t.chains {
		if c.base != nil {
			tr.bases[c.base.Hook] = append(tr.bases[c.base.Hook], name)
		}
	}
	for _, names := range tr.bases {
		slices.SortFunc(names, func(a, b string) int {
			return cmp.Or(cmp.Compare(t.chains[a].base.Priority, t.chains[b].base.Priority), strings.Compare(a, b))
		})
	}
	st := &traceState{src: p.Src, dst: p.Dst, proto: p.Protocol, port: p.Port, output: p.Output, hook: nft.HookPrerouting, out: Outcome{Share: 1}}
	if p.Output {
		st.hook = nft.HookOutput
	}
	st.bases = tr.bases[st.hook]
	var outs []Outcome
	for next := []*traceState{st}; len(next) > 0; next, tr.forks = tr.forks, nil {
		for _, st := range next {
			out, err := tr.run(st)
			if err != nil {
				return nil, fmt.Errorf("trace %s %s -> %s: %w", strings.ToLower(p.Protocol), p.Src, netip.AddrPortFrom(p.Dst, p.Port), err)
			}
			outs = append(outs, out)
			if len(outs) > maxTraceOutcomes {
				return nil, fmt.Errorf("trace %s %s -> %s: more than %d outcomes", strings.ToLower(p.Protocol), p.Src, netip.AddrPortFrom(p.Dst, p.Port), maxTraceOutcomes)
			}
		}
	}
	return outs, nil
}

type tracer struct {
	t        *fakeTable
	affinity map[string]map[netip.Addr]bool
	local    func(netip.Addr) bool
	bases    map[nft.Hook][]string // base chains by hook, in the order they run
	forks    []*traceState         // ways a MatchRandom did not match, still to run
}

type traceState struct {
	src, dst netip.Addr
	proto    string
	port     uint16
	output   bool
	mark     uint32
	dnated   bool
	out      Outcome

	hook   nft.Hook
	bases  []string // base chains of hook still to run
	natted bool     // a nat chain of hook has NATed the packet
	stack  []traceFrame
	steps  int
}

type traceFrame struct {
	chain string
	rule  int // next rule to run
}

func (st *traceState) clone() *traceState {
	c := *st
	c.out.AffinityUpdates = slices.Clone(st.out.AffinityUpdates)
	c.out.Chains = slices.Clone(st.out.Chains)
	c.stack = slices.Clone(st.stack)
	return &c
}

func (st *traceState) v6() bool { return st.dst.Is6() }

// dnat sends the packet to d.
func (st *traceState) dnat(d netip.AddrPort) {
	st.dst, st.port, st.dnated, st.natted = d.Addr(), d.Port(), true, true
	st.out.DNAT = d
}

func (st *traceState) enter(chain string) {
	st.out.Chains = append(st.out.Chains, chain)
}

// nextHook returns the hook the packet takes after st.hook; false when it
// has arrived or left.
func (tr *tracer) nextHook(st *traceState) (nft.Hook, bool) {
	switch st.hook {
	case nft.HookPrerouting:
		if tr.local(st.dst) {
			return nft.HookInput, true
		}
		return nft.HookForward, true
	case nft.HookForward, nft.HookOutput:
		return nft.HookPostrouting, true
	case nft.HookPostrouting:
		if st.output && tr.local(st.dst) {
			return nft.HookInput, true
		}
	}
	return "", false
}

// ruleResult is what a rule did: nothing (next rule), a verdict, or
// settled the packet's fate.
type ruleResult struct {
	verdict *nft.Verdict
	stop    bool
	// next: the statement matched (or acted) and the rule goes on; only
	// a statement's result (stmt.go) has it.
	next bool
}

// run follows one way of the packet to its end.
func (tr *tracer) run(st *traceState) (Outcome, error) {
	for {
		if st.steps++; st.steps > maxTraceSteps {
			return Outcome{}, fmt.Errorf("more than %d steps: a loop?", maxTraceSteps)
		}
		if len(st.stack) == 0 {
			if len(st.bases) == 0 {
				next, ok := tr.nextHook(st)
				if !ok {
					return st.out, nil
				}
				st.hook, st.bases, st.natted = next, tr.bases[next], false
				continue
			}
			name := st.bases[0]
			st.bases = st.bases[1:]
			if st.natted && tr.t.chains[name].base.Type == nft.ChainTypeNAT {
				continue
			}
			st.stack = append(st.stack, traceFrame{chain: name})
			st.enter(name)
			continue
		}
		top := &st.stack[len(st.stack)-1]
		c := tr.t.chains[top.chain]
		if top.rule >= len(c.rules) {
			// A regular chain returns; a base chain's policy accepts.
			st.stack = st.stack[:len(st.stack)-1]
			continue
		}
		r := c.rules[top.rule]
		top.rule++
		res, err := tr.evalRule(st, r)
		if err != nil {
			return Outcome{}, fmt.Errorf("chain %s rule %d (%s): %w", top.chain, top.rule-1, r, err)
		}
		switch {
		case res.stop:
			return st.out, nil
		case res.verdict != nil:
			if tr.verdict(st, *res.verdict) {
				return st.out, nil
			}
		}
	}
}

// verdict applies v and reports whether the packet's fate is settled.
func (tr *tracer) verdict(st *traceState, v nft.Verdict) bool {
	switch v.Kind {
	case nft.VerdictAccept:
		st.stack = st.stack[:0]
	case nft.VerdictDrop:
		st.out.Dropped = true
		return true
	case nft.VerdictReturn:
		st.stack = st.stack[:len(st.stack)-1]
	case nft.VerdictJump:
		st.stack = append(st.stack, traceFrame{chain: v.Chain})
		st.enter(v.Chain)
	case nft.VerdictGoto:
		st.stack[len(st.stack)-1] = traceFrame{chain: v.Chain}
		st.enter(v.Chain)
	}
	return false
}

// evalRule runs a rule's statements (each by its entry in stmt.go) until
// one does not match (the zero result) or one decides.
func (tr *tracer) evalRule(st *traceState, r nft.Rule) (ruleResult, error) {
	for _, s := range r.Stmts {
		k, ok := stmtKindOf(s)
		if !ok {
			return ruleResult{}, fmt.Errorf("statement %T: the tracer does not know it", s)
		}
		res, err := k.eval(tr, st, s)
		if err != nil {
			return ruleResult{}, err
		}
		if !res.next {
			return res, nil
		}
	}
	return ruleResult{}, nil
}
