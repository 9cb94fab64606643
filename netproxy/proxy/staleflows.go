package proxy

import (
	"net/netip"
	"slices"

	"github.com/outpost-edge/outpost/netproxy/podnet"
	"github.com/outpost-edge/outpost/netproxy/servicemodel"
)

// This file finds the UDP conntrack flows that an applied change made
// stale and has Deps.Conntrack delete them.

// Filter selects UDP conntrack flows.
type Filter = podnet.UDPFlowFilter

// Conntrack deletes UDP flows. UDP has no connection to close, so a flow
// DNATed to an endpoint that has gone would keep sending the client's
// packets into the void until it times out; a flow recorded while a
// service had no endpoint would never be DNATed. podnet.Conntrack is the
// netlink one.
type Conntrack interface {
	DeleteUDP(filters []Filter) (deleted int, err error)
}

// udpPort is what conntrack cleanup needs of one UDP service port.
type udpPort struct {
	dests     []netip.Addr // cluster, external and load-balancer IPs
	port      uint16
	nodePort  uint16
	endpoints []netip.AddrPort
}

// udpOf is what conntrack cleanup needs of sp, when sp is UDP.
func udpOf(sp *servicemodel.ServicePort) (udpPort, bool) {
	if sp == nil || sp.Protocol != "UDP" {
		return udpPort{}, false
	}
	u := udpPort{port: sp.Port, nodePort: sp.NodePort}
	u.dests = slices.Concat(sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs)
	for _, e := range sp.Usable(false) {
		u.endpoints = append(u.endpoints, netip.AddrPortFrom(e.Addr, e.Port))
	}
	return u, true
}

// staleFlows returns the filters for the flows that the change from prev
// to next makes stale: flows to an endpoint that is no longer usable, and
// flows to a service that had no usable endpoint and now has one.
func staleFlows(prev, next map[string]udpPort) []Filter {
	var out []Filter
	for key, old := range prev {
		cur := next[key]
		for _, ep := range old.endpoints {
			if slices.Contains(cur.endpoints, ep) {
				continue
			}
			for _, d := range old.dests {
				out = append(out, Filter{OrigDst: d, OrigDstPort: old.port, ReplySrc: ep.Addr()})
			}
			if old.nodePort != 0 {
				out = append(out, Filter{OrigDstPort: old.nodePort, ReplySrc: ep.Addr()})
			}
		}
	}
	for key, cur := range next {
		if len(cur.endpoints) == 0 || len(prev[key].endpoints) > 0 {
			continue
		}
		for _, d := range cur.dests {
			out = append(out, Filter{OrigDst: d, OrigDstPort: cur.port})
		}
		if cur.nodePort != 0 {
			out = append(out, Filter{OrigDstPort: cur.nodePort})
		}
	}
	slices.SortFunc(out, func(a, b Filter) int {
		if c := a.OrigDst.Compare(b.OrigDst); c != 0 {
			return c
		}
		if a.OrigDstPort != b.OrigDstPort {
			return int(a.OrigDstPort) - int(b.OrigDstPort)
		}
		return a.ReplySrc.Compare(b.ReplySrc)
	})
	return slices.Compact(out)
}

// cleanConntrack deletes the flows the last applied change made stale:
// next holds every UDP service port when all is set, else the ports that
// changed (a zero udpPort for one gone or no longer UDP).
func (p *Proxy) cleanConntrack(next map[string]udpPort, all bool) {
	p.mu.Lock()
	prev := p.usable
	if all || prev == nil {
		p.usable = next
	} else {
		changed := make(map[string]udpPort, len(next))
		for k, u := range next {
			if old, ok := prev[k]; ok {
				changed[k] = old
			}
			if u.port == 0 {
				delete(prev, k)
			} else {
				prev[k] = u
			}
		}
		prev = changed
	}
	p.mu.Unlock()
	if p.deps.Conntrack == nil || prev == nil {
		return
	}
	filters := staleFlows(prev, next)
	if len(filters) == 0 {
		return
	}
	n, err := p.deps.Conntrack.DeleteUDP(filters)
	if err != nil {
		p.deps.Log.Warn("delete stale udp flows", "err", err)
		return
	}
	p.deps.Log.Debug("deleted stale udp flows", "flows", n, "filters", len(filters))
}
