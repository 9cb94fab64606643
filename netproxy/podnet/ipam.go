package podnet

import (
	"fmt"
	"net/netip"
	"slices"
)

// addressRange describes the usable addresses of an IPv4 pod CIDR.
type addressRange struct {
	prefix  netip.Prefix
	gateway netip.Addr // first address after the network address
	first   netip.Addr // first address handed to pods
	last    netip.Addr // last address handed to pods (before broadcast)
}

// newAddressRange validates p as a pod CIDR and returns its usable range.
func newAddressRange(p netip.Prefix) (addressRange, error) {
	if !p.IsValid() {
		return addressRange{}, fmt.Errorf("pod CIDR is not set")
	}
	if !p.Addr().Is4() {
		return addressRange{}, fmt.Errorf("pod CIDR %s: only IPv4 is supported", p)
	}
	if p.Masked() != p {
		return addressRange{}, fmt.Errorf("pod CIDR %s: not a network address (want %s)", p, p.Masked())
	}
	if p.Bits() > 30 {
		return addressRange{}, fmt.Errorf("pod CIDR %s: too small, need at least a /30", p)
	}
	a4 := p.Addr().As4()
	n := uint32(a4[0])<<24 | uint32(a4[1])<<16 | uint32(a4[2])<<8 | uint32(a4[3])
	bcast := n | (1<<(32-p.Bits()) - 1)
	gw := p.Addr().Next()
	return addressRange{
		prefix:  p,
		gateway: gw,
		first:   gw.Next(),
		last:    u32Addr(bcast - 1),
	}, nil
}

func u32Addr(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// choice is what the allocator decided for one owner.
type choice struct {
	addr netip.Addr
	// existing reports whether owner already held addr.
	existing bool
	// stale lists addresses owner holds outside the range; they are
	// released before addr is reserved.
	stale []string
}

// choose picks owner's address from allocs (address → owner): the lowest
// address owner already holds inside the range, else the lowest free one.
// Entries whose key does not parse are treated as taken by nobody.
func (r addressRange) choose(allocs map[string]string, owner string) (choice, error) {
	var c choice
	taken := make(map[netip.Addr]bool, len(allocs))
	var own []netip.Addr
	for s, o := range allocs {
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		a = a.Unmap()
		inRange := r.prefix.Contains(a) && a.Compare(r.first) >= 0 && a.Compare(r.last) <= 0
		switch {
		case o == owner && inRange:
			own = append(own, a)
		case o == owner:
			c.stale = append(c.stale, s)
		default:
			taken[a] = true
		}
	}
	slices.Sort(c.stale)
	if len(own) > 0 {
		c.addr, c.existing = slices.MinFunc(own, netip.Addr.Compare), true
		c.stale = nil // keep everything; Teardown releases it all
		return c, nil
	}
	for a := r.first; a.Compare(r.last) <= 0; a = a.Next() {
		if !taken[a] {
			c.addr = a
			return c, nil
		}
	}
	return choice{}, fmt.Errorf("pod CIDR %s is exhausted: all %d addresses are allocated", r.prefix, len(taken))
}
